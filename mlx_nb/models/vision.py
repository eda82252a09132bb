"""Vision-language models (mlx_vlm) loaded so mlx_lm's BatchGenerator can decode them in one batch.

Each vision request is prefilled alone through mlx_vlm (its processor, vision tower and input
embeddings: the engine's vision prefill), and its cache then joins the shared decode batch. Two
small pieces make the unmodified BatchGenerator drive an mlx_vlm language model of any family:

- `VisionLMAdapter`: called like an mlx_lm model (`model(tokens, cache=...) -> logits`);
- `RopeDeltaCache`: for mRoPE families (Qwen-VL, GLM-4V), the last entry of every cache list,
  carrying each row's position delta through merge / filter / extend / extract.

mlx_vlm's language models keep the current request's mRoPE state on the module (`_position_ids`,
`_rope_deltas`): a batch holds many requests, so the adapter installs the batch's own per-row
deltas before every decode step, and a prefill installs its request's state before each chunk.

A family the compatibility sweep found it cannot batch (mlx_nb/compat/mlx_vlm.json, verdict
"sequential") is served one request at a time through mlx_vlm's own generate_step
(engine/scheduling/sequential.py), with the sweep's one-line reason; so is a family whose language model
takes state carried from step to step (cross-attention states, encoder outputs: mlx_vlm's
generate passes them from one decode step to the next; a batch row has nowhere to keep them).
Only a "refused" family (wrong even one request at a time) is refused here, at load.
`MLX_NB_VISION_COMPAT` names another verdict file, or none when empty (the sweep itself reads
none: it decides them).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

import mlx.nn as nn

from mlx_nb.models.loaded import LoadedModel, ModelLoadError
from mlx_nb.models.rope_delta_cache import RopeDeltaCache

log = logging.getLogger("mlx_nb.models")

# Per-request state mlx_vlm's language models keep on the module between calls.
MODULE_STATE = ("_position_ids", "_rope_deltas")
# Language-model inputs mlx_vlm's generate carries from one decode step to the next, per request.
STEP_STATE = ("cross_attention_states", "encoder_outputs", "decoder_input_ids")


class VisionFamilyRefused(ModelLoadError):
    """A vision family the sweep found wrong even one request at a time; `reason` says why, in one line."""

    def __init__(self, name: str, family: Optional[str], reason: str):
        super().__init__(f"{name}: mlx_vlm family {family!r} cannot be served: {reason}")
        self.family, self.reason = family, reason


COMPAT_FILE = Path(__file__).resolve().parent.parent / "compat" / "mlx_vlm.json"


def module_state(lm: nn.Module) -> dict:
    return {name: getattr(lm, name) for name in MODULE_STATE if hasattr(lm, name)}


def set_module_state(lm: nn.Module, state: dict) -> None:
    for name, value in state.items():
        setattr(lm, name, value)


class VisionLMAdapter(nn.Module):
    """An mlx_vlm language model behind the mlx_lm model interface BatchGenerator calls.

    `rope_deltas`: the model places tokens at `offset + delta` (mRoPE), so every cache list ends
    with a RopeDeltaCache. `padding_mask`: the model attends both ways and so builds no causal
    mask of its own; in a batch the rows' left padding must still be masked, so the adapter
    passes the batch cache's mask.
    """

    def __init__(self, language_model: nn.Module, rope_deltas: bool, padding_mask: bool):
        super().__init__()
        self.language_model = language_model
        self.rope_deltas = rope_deltas
        self.padding_mask = padding_mask

    @property
    def layers(self):
        return self.language_model.layers

    def make_cache(self) -> list:
        from mlx_vlm.models.cache import make_prompt_cache

        caches = make_prompt_cache(self.language_model)
        return [*caches, RopeDeltaCache()] if self.rope_deltas else caches

    def __call__(self, inputs, cache: Optional[list] = None, **kwargs):
        lm = self.language_model
        if cache is None:
            return lm(inputs, **kwargs).logits
        layers = list(cache[:-1] if self.rope_deltas else cache)
        if self.rope_deltas:
            deltas = cache[-1].deltas
            set_module_state(lm, {"_position_ids": None, "_rope_deltas": deltas})
            kwargs["rope_deltas"] = deltas
        if self.padding_mask:
            from mlx_vlm.models.base import create_attention_mask

            kwargs["mask"] = create_attention_mask(inputs, layers[0], return_array=True)
        out = lm(inputs, cache=layers, **kwargs)
        # With a one-row batch cache some models REPLACE entries of the list they are given;
        # write them back into the list BatchGenerator holds, or the update is lost.
        cache[: len(layers)] = layers
        return out.logits


def load_vision_model(name: str, path: Path, config: dict):
    """mlx_vlm model + processor, wrapped into a LoadedModel(kind="vision")."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_vlm.utils import get_model_type, load


    family = get_model_type(config)
    matrix = verdict_file()
    verdict = sweep_verdict(family, matrix) if matrix else None
    if verdict is not None and verdict.get("verdict") == "refused":
        raise VisionFamilyRefused(name, family, verdict.get("reason", "refused by the compatibility matrix"))
    if matrix and verdict is None:
        log.warning("mlx_nb: vision family %r is not in the compatibility sweep; it is served unverified", family)
    vision_model, processor = load(str(path))
    eos = getattr(vision_model.config, "eos_token_id", None)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    # mlx_lm's own loader wraps the same tokenizer files the processor read, choosing the streaming
    # detokenizer (BPE/SPM) and tool parser exactly as for a text model.
    tokenizer = load_tokenizer(Path(path), eos_token_ids=eos or None)
    lm = vision_model.language_model
    carried = [p for p in STEP_STATE if p in inspect.signature(lm.__call__).parameters]
    sequential = (f"its language model takes {', '.join(carried)} from step to step, per request: a shared "
                  "decode batch has no place for them") if carried else None
    if verdict is not None and verdict.get("verdict") == "sequential":
        sequential = sequential or verdict.get("reason", "the compatibility matrix serves it one request at a time")
    text_config = getattr(vision_model.config, "text_config", None)
    adapter = VisionLMAdapter(
        lm,
        rope_deltas=hasattr(lm, "_rope_deltas"),
        padding_mask=bool(getattr(text_config, "use_bidirectional_attention", False)),
    )
    return LoadedModel(
        name=name,
        path=Path(path),
        kind="vision",
        model=adapter,
        tokenizer=tokenizer,
        config=config,
        processor=processor,
        vision_model=vision_model,
        sequential=sequential,
    )


def verdict_file() -> Optional[Path]:
    """The verdicts the loader honours: the committed matrix, another file, or none."""
    path = os.environ.get("MLX_NB_VISION_COMPAT", str(COMPAT_FILE))
    return Path(path) if path else None


def sweep_verdict(family: Optional[str], path: Path = COMPAT_FILE) -> Optional[dict]:
    """The compatibility sweep's entry for an mlx_vlm model type, or None if it was never swept."""
    try:
        entries = json.loads(Path(path).read_text())["entries"]
    except (OSError, ValueError, KeyError):
        return None
    return next((e for e in entries if e.get("architecture") == family), None)


def chunked_prefill_allowed(vision_model: Any, **policy_inputs) -> bool:
    """Whether a prompt may be read in chunks, by the model's own hooks (as mlx_vlm's generation
    decides it: a prefix-LM whose prompt attends both ways must be read in one pass)."""
    for candidate in (vision_model, getattr(vision_model, "language_model", None)):
        policy = getattr(candidate, "chunked_prefill_policy", None)
        if callable(policy):
            answer = policy(draft_model=None, draft_kind=None, **policy_inputs)
            return bool(getattr(answer, "enabled", answer))
    return not any(getattr(c, "no_chunked_prefill", False) for c in (vision_model, vision_model.language_model))
