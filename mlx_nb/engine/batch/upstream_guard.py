"""The private parts of mlx_lm (and mlx_vlm) the engine builds on, named in tables and checked.

`decode.py` subclasses mlx_lm's batch classes and overrides private methods (`GenerationBatch._step` / `next`,
`PromptProcessingBatch.split` / `generate` / `prompt`, `BatchGenerator._make_batch`) and reads private
attributes of theirs; `kv_quant.py` subclasses `BatchKVCache` and keeps its private bookkeeping;
`kernels/layers.py` writes keys into `KVCache` / `BatchKVCache` buffers and moves their offsets as
their `update_and_fetch` does (tests/kernels/test_kernels_swap.py compares the two). pyproject.toml
pins mlx-lm exactly; this table is what an upgrade must keep.
`check()` compares each entry with what is installed and returns the differences, one line each;
the engine calls it before it builds a batch (`require()`), so a changed mlx_lm fails at once with
what changed and what to do, never deep inside a decode step.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Optional

TESTED = {"mlx-lm": "0.32.2", "mlx-vlm": "0.7.10"}


@dataclass(frozen=True)
class Private:
    """One private name: a function or method whose parameters we pass by position or override
    (`params`, in order, None when only its presence matters), or a class attribute."""

    where: str  # "module:Class.attr"
    params: Optional[tuple] = None
    why: str = ""


PRIVATE_API = (
    Private("mlx_lm.generate:GenerationBatch.__init__",
            ("self", "model", "uids", "inputs", "prompt_cache", "tokens", "samplers", "fallback_sampler",
             "logits_processors", "stop_sequences", "max_tokens"),
            "PromptBatch.generate builds a DecodeBatch with these ten, by position"),
    Private("mlx_lm.generate:GenerationBatch._step", ("self",), "DecodeBatch overrides the decode step"),
    Private("mlx_lm.generate:GenerationBatch.empty", ("model", "fallback_sampler"), "Generator's empty decode batch"),
    Private("mlx_lm.generate:GenerationBatch.next", ("self",),
            "DecodeBatch.next keeps its bookkeeping over runs of speculated tokens"),
    Private("mlx_lm.generate:GenerationBatch.extract_cache", ("self", "idx"), "a finished row's cache"),
    Private("mlx_lm.generate:GenerationBatch.Response",
            ("uid", "token", "logprobs", "finish_reason", "prompt_cache", "all_tokens"),
            "DecodeBatch.next makes one per token"),
    Private("mlx_lm.generate:PromptProcessingBatch.split", ("self", "indices"),
            "PromptBatch hands the cache over instead of copying it"),
    Private("mlx_lm.generate:PromptProcessingBatch.generate", ("self", "tokens"),
            "PromptBatch starts finished prompts as a DecodeBatch"),
    Private("mlx_lm.generate:PromptProcessingBatch.prompt", ("self", "tokens"),
            "PromptBatch.generate reads prompts; PromptBatch.prompt gives each row its LoRA adapter"),
    Private("mlx_lm.generate:PromptProcessingBatch.empty", ("model", "fallback_sampler", "prefill_step_size"),
            "Generator's empty prompt batch"),
    Private("mlx_lm.generate:PromptProcessingBatch.filter", ("self", "keep"),
            "PromptBatch empties the same per-row fields"),
    Private("mlx_lm.generate:BatchGenerator._make_batch", ("self", "n"),
            "Generator counts the prompt batch's rows against max_batch"),
    Private("mlx_lm.generate:_merge_caches", ("caches",),
            "requests' caches join a batch through their first layer's merge (QuantizedKV.merge)"),
    Private("mlx_lm.models.cache:BatchKVCache.__init__", ("self", "left_padding"),
            "BatchQuantizedKV is a BatchKVCache over quantized arrays"),
    Private("mlx_lm.models.cache:BatchKVCache.prepare", ("self", "left_padding", "lengths", "right_padding"),
            "BatchQuantizedKV keeps its padding bookkeeping and rolls the arrays it sets"),
    Private("mlx_lm.models.cache:dynamic_roll", ("x", "shifts", "axis"), "BatchQuantizedKV.finalize"),
    Private("mlx_lm.models.base:quantized_scaled_dot_product_attention",
            ("queries", "q_keys", "q_values", "scale", "mask", "group_size", "bits"),
            "the fused attention reads a quantized cache as mlx_lm's models do"),
)

# Attributes read or written on mlx_lm's objects (checked on real instances by the tests).
INSTANCE_ATTRIBUTES = {
    "GenerationBatch": ("model", "uids", "prompt_cache", "tokens", "samplers", "fallback_sampler", "logits_processors",
                        "stop_sequences", "max_tokens", "_current_tokens", "_next_tokens", "_current_logprobs",
                        "_next_logprobs", "_token_context", "_num_tokens", "_matchers"),
    "PromptProcessingBatch": ("model", "uids", "prompt_cache", "tokens", "samplers", "fallback_sampler",
                              "logits_processors", "stop_sequences", "max_tokens", "prefill_step_size"),
    "BatchGenerator": ("_prompt_batch", "_generation_batch", "completion_batch_size", "sampler", "model",
                       "prefill_step_size"),
    "BatchKVCache": ("keys", "values", "offset", "left_padding", "_idx", "_right_padding"),
    "KVCache": ("keys", "values", "offset"),
    # engine/text/textstream.py trims the text a BPE or SPM streaming detokenizer keeps
    "BPEStreamingDetokenizer": ("text", "offset", "last_segment"),
    "SPMStreamingDetokenizer": ("text", "offset", "last_segment"),
}

# mlx_vlm's: the mRoPE state its language models keep on the module for the current request
# (models/vision.py installs each batch row's own; the sequential lane and the vision prefill clear
# and read it), checked on a real instance of each family that has it (tiny-qwen2-vl, tiny-qwen2.5-vl).
VLM_INSTANCE_ATTRIBUTES = {"LanguageModel": ("_position_ids", "_rope_deltas")}


def _resolve(where: str):
    module_name, _, qualname = where.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check(table=PRIVATE_API, resolve=_resolve) -> list[str]:
    """What differs between `table` and what is installed: one line per entry, empty when all hold."""
    problems = []
    for entry in table:
        try:
            obj = resolve(entry.where)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{entry.where} is gone ({exc}); we use it because {entry.why}")
            continue
        if entry.params is None:
            continue
        try:
            params = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            problems.append(f"{entry.where} is no longer a function; we use it because {entry.why}")
            continue
        if params != entry.params:
            problems.append(f"{entry.where} takes {params}, not {entry.params}; we use it because {entry.why}")
    return problems


class UpstreamChanged(RuntimeError):
    """The installed mlx_lm differs from the one the engine is built on."""


def require() -> None:
    """Raise one line naming what changed when the installed mlx_lm differs in a private name we use."""
    problems = check()
    if problems:
        from importlib.metadata import version

        raise UpstreamChanged(
            f"mlx-lm {version('mlx-lm')} is installed, but mlx-nb is built on mlx-lm {TESTED['mlx-lm']} and "
            f"{len(problems)} private name(s) it relies on changed ({problems[0]}): "
            f"run `pip install mlx-lm=={TESTED['mlx-lm']}`"
        )
