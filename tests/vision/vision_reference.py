"""One request at a time through mlx_vlm's OWN generation (`stream_generate` over the full model:
processor outputs, vision tower, embeddings, mRoPE), independent of the engine's adapter, pseudo-cache
and prefill. Runs on the calling thread: call it while no Engine is running. Also: test images."""

from __future__ import annotations

import base64
import io

from mlx_nb.compat.vision_check import MAX_TOKENS, generate_alone, picture  # noqa: F401  (re-exported)


def data_url(img, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def vlm_greedy(loaded, messages=None, images=(), prompt=None, max_tokens: int = MAX_TOKENS) -> list[int]:
    """Greedy token ids of a chat (`messages`) or a completion (`prompt`), stop token excluded."""
    from mlx_nb.engine.inputs.messages import normalize_messages
    from mlx_nb.engine.inputs.vision import render_vision_prompt

    chat = prompt is None
    text = render_vision_prompt(loaded, normalize_messages(messages)) if chat else prompt
    return generate_alone(loaded, text, list(images), chat=chat, max_tokens=max_tokens)[0]
