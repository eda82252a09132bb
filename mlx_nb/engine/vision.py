"""Vision-language models in the shared batch: load, adapter, per-request prefill.

The recipe: each request is prefilled ALONE (batch size 1) through
mlx_vlm — vision tower, image features scattered into the prompt embeddings, 3-D mRoPE positions —
over all but its last prompt token. Its cache is then MOVED into mlx_lm's BatchGenerator together
with that last token, and decoded in the shared batch like any text request. Two small pieces make
the unmodified BatchGenerator drive an mlx_vlm language model:

- `VisionLMAdapter`: called like an mlx_lm model (`model(tokens, cache=...) -> logits`);
- `RopeDeltaCache` (vision_cache.py): the last entry of every cache list, carrying each row's
  mRoPE position delta through merge / filter / extend / extract.

Text-only requests to a vision model take the same path (delta 0), so every row of the batch has
the same cache layout. `render_vision_prompt` is pure templating (no MLX): the engine calls it on
the caller's thread, so a template error is refused at submit. `prefill_vision` runs on the engine
thread only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import mlx.nn as nn

from mlx_nb.engine.types import RequestError
from mlx_nb.engine.vision_cache import RopeDeltaCache

_IMAGE_PARTS = {"image", "image_url", "input_image"}


class VisionLMAdapter(nn.Module):
    """An mlx_vlm language model behind the mlx_lm model interface BatchGenerator calls."""

    def __init__(self, language_model: nn.Module):
        super().__init__()
        self.language_model = language_model

    @property
    def layers(self):
        return self.language_model.layers

    def make_cache(self) -> list:
        from mlx_vlm.models.cache import make_prompt_cache

        return [*make_prompt_cache(self.language_model), RopeDeltaCache()]

    def __call__(self, inputs, cache: Optional[list] = None, **kwargs):
        if cache is None:
            return self.language_model(inputs, **kwargs).logits
        layers = list(cache[:-1])
        out = self.language_model(inputs, cache=layers, rope_deltas=cache[-1].deltas, **kwargs)
        # With a one-row batch cache the LM REPLACES entries of the list it is given;
        # write them back into the list BatchGenerator holds, or the update is lost.
        cache[:-1] = layers
        return out.logits


# -- loading ------------------------------------------------------------------------------------
def load_vision_model(name: str, path: Path, config: dict):
    """mlx_vlm model + processor, wrapped into a LoadedModel(kind="vision")."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_vlm.utils import load

    from mlx_nb.models.loader import LoadedModel

    vision_model, processor = load(str(path))
    eos = getattr(vision_model.config, "eos_token_id", None)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    # mlx_lm's own loader wraps the same tokenizer files the processor read, choosing the streaming
    # detokenizer (BPE/SPM) and tool parser exactly as for a text model.
    tokenizer = load_tokenizer(Path(path), eos_token_ids=eos or None)
    return LoadedModel(
        name=name,
        path=Path(path),
        kind="vision",
        model=VisionLMAdapter(vision_model.language_model),
        tokenizer=tokenizer,
        config=config,
        processor=processor,
        vision_model=vision_model,
    )


# -- prompts (caller thread: no MLX) ------------------------------------------------------------
def template_messages(messages: list[dict]) -> list[dict]:
    """The conversation as the template sees it: image parts become `{"type": "image"}`
    (their pixels never go through jinja), text parts stay, strings stay strings."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [
                {"type": "image"} if p.get("type") in _IMAGE_PARTS else {"type": "text", "text": p.get("text", "")}
                for p in content
            ]
        out.append({**m, "content": content})
    return out


def render_vision_prompt(
    loaded: Any,
    messages: list[dict],
    tools: Optional[list] = None,
    template_kwargs: Optional[dict] = None,
) -> str:
    """The prompt text of a normalized conversation: system prompt and every turn, each image as
    the template's placeholder (the processor expands it to the image's token count)."""
    template = getattr(loaded.processor, "chat_template", None) or loaded.tokenizer.chat_template
    if template is None:
        raise RequestError(f"{loaded.name} has no chat template: send a completion prompt instead", "messages")
    try:
        return loaded.tokenizer.apply_chat_template(
            template_messages(messages),
            chat_template=template,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
    except Exception as exc:  # jinja TemplateError, or a template's raise_exception
        raise RequestError(f"the chat template rejected the conversation: {exc}", "messages") from exc


def prepare_vision_request(loaded: Any, request: Any, image_options: Any) -> tuple[list[int], list, str]:
    """Caller thread: decode images, normalize and render a request to a vision model.

    Returns (prompt_tokens, images, prompt_text). Until the prefill expands them, each image
    counts as one token (its placeholder): `prefill_request` replaces the tokens with the real ones.
    """
    from mlx_nb.engine.images import decode_message_images, images_in
    from mlx_nb.engine.messages import normalize_messages
    from mlx_nb.engine.prompts import encode_prompt

    if request.messages is None:
        if not isinstance(request.prompt, str):
            raise RequestError("prompt must be a string", "prompt")
        return encode_prompt(loaded.tokenizer, request.prompt, chat=False), [], request.prompt
    messages = normalize_messages(decode_message_images(request.messages, image_options))
    request.messages = messages
    text = render_vision_prompt(loaded, messages, request.tools, request.chat_template_kwargs)
    return encode_prompt(loaded.tokenizer, text, chat=True), images_in(messages), text


# -- prefill (engine thread) --------------------------------------------------------------------
def prefill_request(loaded: Any, live: Any, step_size: int = 512) -> tuple[list, list[int]]:
    """Engine thread: prefill a LiveRequest alone; sets its real prompt tokens and returns
    (caches, all_tokens) for `BatchRunner.admit`."""
    chat = live.request.messages is not None
    caches, all_tokens, tokens = prefill_vision(
        loaded, live.request.messages, live.images, text=live.extra.get("prompt_text"), chat=chat, step_size=step_size
    )
    context = loaded.context_length
    if len(tokens) >= context:
        raise RequestError(f"the prompt is {len(tokens)} tokens (images included) but {loaded.name} holds {context}")
    live.prompt_tokens = tokens
    sampling = live.request.sampling
    sampling.max_tokens = min(sampling.max_tokens, context - len(tokens))
    return caches, all_tokens


def prefill_vision(
    loaded: Any,
    messages: Optional[list[dict]],
    images: list,
    *,
    text: Optional[str] = None,
    chat: bool = True,
    step_size: int = 512,
) -> tuple[list, list[int], list[int]]:
    """Prefill one request alone: returns (caches, all_tokens, prompt_tokens).

    `caches` hold every prompt token but the last (`all_tokens`), plus the request's RopeDeltaCache;
    `BatchRunner.admit(live, caches=caches, all_tokens=all_tokens)` moves them into the batch with
    the last token. `text` is the prompt already rendered at submit (else `messages` is rendered).
    """
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    from mlx_nb.engine.prompts import encode_prompt

    vm = loaded.vision_model
    lm = vm.language_model
    if text is None:
        text = render_vision_prompt(loaded, messages)
    if images:
        inputs = loaded.processor(text=[text], images=list(images), add_special_tokens=not chat)
        input_ids = mx.array(inputs["input_ids"]).reshape(1, -1)
        extra = {"image_grid_thw": inputs["image_grid_thw"]}
        pixel_values = inputs["pixel_values"]
    else:
        input_ids = mx.array(encode_prompt(loaded.tokenizer, text, chat=chat))[None]
        extra, pixel_values = {}, None
    tokens = input_ids[0].tolist()

    # The LM keeps the last request's mRoPE state on the module; clear it, and pass
    # explicit position ids below so nothing stale is ever read.
    for attr in ("_position_ids", "_rope_deltas"):
        if hasattr(lm, attr):
            setattr(lm, attr, None)
    feats = vm.get_input_embeddings(input_ids, pixel_values, **extra)

    cache = make_prompt_cache(lm)
    n = len(tokens) - 1
    side = {k: v for k in ("visual_pos_masks", "deepstack_visual_embeds") if (v := getattr(feats, k, None)) is not None}
    for start in range(0, n, step_size):
        end = min(n, start + step_size)
        kwargs = dict(side)
        if feats.position_ids is not None:
            kwargs["position_ids"] = feats.position_ids[..., start:end]
        lm(input_ids[:, start:end], inputs_embeds=feats.inputs_embeds[:, start:end], cache=cache, **kwargs)
        mx.eval([c.state for c in cache])
    delta = feats.rope_deltas if feats.rope_deltas is not None else 0
    return [*cache, RopeDeltaCache.of(delta)], tokens[:-1], tokens
