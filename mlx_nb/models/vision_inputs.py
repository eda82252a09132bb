"""A vision request's model inputs, built the way mlx_vlm's own generation builds them.

mlx_vlm's `generate` runs the family's processor over the prompt and images, hands EVERY
processor output to `get_input_embeddings` (pixel values and the attention mask by name, the rest
-- image_grid_thw, image_sizes, pixel_attention_mask, token_type_ids, ... -- as keywords), and
then calls the language model with those keywords plus whatever the embedding step returned
(position ids, rope deltas, visual masks, ...). Nothing here names a family's keys: whatever the
processor and the embedding step produce is passed on.

Two deliberate differences from `mlx_vlm.utils.prepare_inputs`, both for one prompt at a time:
the processor is called without `padding` (prepare_inputs forwards it into image processors that
reject unknown keywords, which breaks LLaVA-style processors under transformers 5), and a chat
prompt is tokenized without added special tokens (its template already wrote them).
Engine thread only: processors return MLX arrays.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

import mlx.core as mx
import numpy as np

# Processor outputs passed to get_input_embeddings positionally (as generate_step does), not as keywords.
_POSITIONAL = ("input_ids", "pixel_values", "attention_mask")


@dataclass
class VisionInputs:
    input_ids: mx.array  # (1, tokens): the prompt with every image placeholder expanded
    pixel_values: Any = None
    mask: Optional[mx.array] = None
    extra: dict = field(default_factory=dict)  # every other processor output, by name


@dataclass
class Embedded:
    embeds: mx.array  # (1, positions, hidden): usually one position per token
    lm_kwargs: dict  # keywords for every prefill call of the language model
    position_ids: Optional[mx.array] = None  # full-prompt positions (mRoPE), sliced per chunk


def text_only(tokens: list[int]) -> VisionInputs:
    """A request without images: its tokens are the tokenizer's (mlx_vlm does the same)."""
    ids = mx.array(tokens)[None]
    return VisionInputs(ids, mask=mx.ones(ids.shape, dtype=mx.int32))


def process(loaded: Any, text: str, images: list, chat: bool) -> VisionInputs:
    """Tokens and processor outputs of a request with images."""
    processor = loaded.processor
    if _own_image_processor(processor):  # mlx_vlm's own image processors: its own prompt builder
        from mlx_vlm.utils import prepare_inputs

        outputs = prepare_inputs(processor, images=list(images), prompts=[text], add_special_tokens=not chat,
                                 image_token_index=getattr(loaded.vision_model.config, "image_token_index", None))
    else:
        outputs = _call_processor(processor, text, list(images), add_special_tokens=not chat)
    outputs = dict(outputs)
    if "images" in outputs:
        outputs["pixel_values"] = outputs.pop("images")
    converted = {k: _to_mx(v) for k, v in outputs.items()}
    ids = converted.pop("input_ids").reshape(1, -1)
    extra = {k: v for k, v in converted.items() if k not in _POSITIONAL}
    return VisionInputs(ids, converted.get("pixel_values"), converted.get("attention_mask"), extra)


def embed(vision_model: Any, inputs: VisionInputs) -> Embedded:
    """Run the vision tower and merge its features into the prompt embeddings (generate_step's
    recipe); returns the embeddings and the keywords every language-model prefill call gets."""
    feats = vision_model.get_input_embeddings(inputs.input_ids, inputs.pixel_values, mask=inputs.mask, **inputs.extra)
    kwargs = dict(inputs.extra)
    kwargs.update({k: v for k, v in feats.to_dict().items() if k != "inputs_embeds" and v is not None})
    position_ids = kwargs.pop("position_ids", None)
    if position_ids is None:  # some families (GLM-4V) leave the prompt's positions on the module
        position_ids = getattr(vision_model.language_model, "_position_ids", None)
    return Embedded(feats.inputs_embeds, kwargs, position_ids)


def _own_image_processor(processor: Any) -> bool:
    from mlx_vlm.models.base import BaseImageProcessor

    return isinstance(getattr(processor, "image_processor", None), BaseImageProcessor)


def _call_processor(processor: Any, text: str, images: list, add_special_tokens: bool):
    """The processor over one prompt, called as mlx_vlm's `process_inputs` calls it (MLX tensors,
    `add_special_tokens` where its signature names it), `padding` left out."""
    method = getattr(processor, "process", processor)
    args: dict = {"text": [text], "images": images, "return_tensors": "mlx"}
    if "add_special_tokens" in inspect.signature(method).parameters:
        args["add_special_tokens"] = add_special_tokens
    return method(**args)


def _to_mx(value: Any) -> Any:
    """As prepare_inputs converts processor outputs: arrays and scalars to mx.array, lists kept."""
    if value is None or isinstance(value, (mx.array, str, list)):
        return value
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return mx.array(value)
    try:
        return mx.array(value)
    except (TypeError, ValueError):
        return value
