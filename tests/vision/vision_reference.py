"""One request at a time through mlx_vlm's OWN generation path (`generate_step` over the full
model: vision tower, embeddings, mRoPE), independent of our adapter, pseudo-cache and prefill.
Runs on the calling thread: call it while no Engine is running. Also: small test images."""

from __future__ import annotations

import base64
import io

import numpy as np

MAX_TOKENS = 10


def picture(width: int, height: int, seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))


def data_url(img, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def vlm_greedy(loaded, messages=None, images=(), prompt=None, max_tokens: int = MAX_TOKENS) -> list[int]:
    """Greedy token ids, stop token excluded (as the engine reports them)."""
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step

    from mlx_nb.engine.messages import normalize_messages
    from mlx_nb.engine.prompts import encode_prompt
    from mlx_nb.engine.vision import render_vision_prompt

    chat = prompt is None
    text = render_vision_prompt(loaded, normalize_messages(messages)) if chat else prompt
    pixels, kwargs = None, {}
    if images:
        inputs = loaded.processor(text=[text], images=list(images), add_special_tokens=False)
        ids, pixels, kwargs = inputs["input_ids"], inputs["pixel_values"], {"image_grid_thw": inputs["image_grid_thw"]}
    else:
        ids = mx.array(encode_prompt(loaded.tokenizer, text, chat=chat))[None]
    lm = loaded.vision_model.language_model
    lm._position_ids = lm._rope_deltas = None  # the LM keeps the previous request's mRoPE state
    eos = set(loaded.tokenizer.eos_token_ids)
    out = []
    for token, _ in generate_step(ids, loaded.vision_model, pixels, None, max_tokens=max_tokens, temperature=0.0, **kwargs):
        token = int(token)
        if token in eos:
            break
        out.append(token)
    return out
