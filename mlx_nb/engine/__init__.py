"""The batched engine, and its face: the one module code outside `mlx_nb/engine/` imports.

The engine lives in rooms, one concern each:

- `scheduling/` — the engine thread: its loop, the batch runner, who runs when (the background lane
  of dataset jobs, prefill pacing, the sequential and vision lanes), memory, latency;
- `batch/` — mlx_lm's BatchGenerator with our decode step, and what may batch (measured, probed),
  with every private upstream name it relies on checked in one place;
- `caches/` — what a layer cache is, the quantized KV cache, the prefix cache and its disk folder;
- `speculation/` — prompt lookup and a draft model, per row of the batch;
- `inputs/` — a request made into prompt tokens: messages, chat templates, images, tools, fill-in-the-middle;
- `text/` — tokens made into text: the detokenizing stream, a thinking model's reasoning;
- `sampling/` — samplers, logits processors and constrained decoding;
- `embedding/` — embedding models (a text made into one vector), batched on their own thread.

`Engine` (engine.py) ties them together behind a thread-safe face. Names are loaded on first use
(PEP 562): importing a value type from here (`RequestError`, `SubmitRequest`, `Constraint`) loads
that room's module, not MLX, so the API layer, the client and the widgets stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module (under mlx_nb.engine) that defines it
_EXPORTS = {
    "Engine": "engine",
    "EngineConfig": "config",
    "settings_rows": "config",
    "Embedder": "embedding.embedder",
    "Embeddings": "embedding.embedder",
    "EmbedderUnavailable": "embedding.files",
    "DEFAULT_EMBEDDER": "embedding.files",
    "EngineClosedError": "scheduling.loop",
    "RequestHandle": "handle",
    "SubmitRequest": "submit_request",
    "Delta": "types",
    "Request": "types",
    "RequestError": "types",
    "ContextOverflowError": "types",
    "TooLargeError": "types",
    "Result": "types",
    "SamplingParams": "types",
    "TokenLogprob": "types",
    "Usage": "types",
    "first_line": "types",
    "Constraint": "sampling.constrained",
    "closed": "sampling.constrained",
    "tool_call": "sampling.constrained",
    "GENERIC_TOOLS": "inputs.generic_tools",
    "TOOL_MARKERS": "inputs.generic_tools",
    "normalize_messages": "inputs.messages",
    "encode_prompt": "inputs.prompts",
    "render_chat": "inputs.prompts",
    "render_vision_prompt": "inputs.vision",
    "prefetch_remote_images": "inputs.images",
    "default_prefix_folder": "caches.prefix_disk",
    "KVQuantization": "caches.kv_quant",
    "physical_memory": "scheduling.memory",
    "default_prefix_budget": "scheduling.memory",
    "unmergeable": "batch.batchability",
    "responses": "batch.upstream",
}
# names the face gives under another name than their module's
_RENAMED = {"GENERIC_TOOLS": "GENERIC", "TOOL_MARKERS": "MARKERS", "default_prefix_folder": "default_folder"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mlx_nb.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mlx_nb.engine.{module}"), _RENAMED.get(name, name))
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # for type checkers and editors; at run time names load on first use
    from mlx_nb.engine.batch.batchability import unmergeable
    from mlx_nb.engine.batch.upstream import responses
    from mlx_nb.engine.caches.kv_quant import KVQuantization
    from mlx_nb.engine.caches.prefix_disk import default_folder as default_prefix_folder
    from mlx_nb.engine.config import EngineConfig, settings_rows
    from mlx_nb.engine.embedding.embedder import Embedder, Embeddings
    from mlx_nb.engine.embedding.files import DEFAULT_EMBEDDER, EmbedderUnavailable
    from mlx_nb.engine.engine import Engine
    from mlx_nb.engine.handle import RequestHandle
    from mlx_nb.engine.inputs.generic_tools import GENERIC as GENERIC_TOOLS
    from mlx_nb.engine.inputs.generic_tools import MARKERS as TOOL_MARKERS
    from mlx_nb.engine.inputs.images import prefetch_remote_images
    from mlx_nb.engine.inputs.messages import normalize_messages
    from mlx_nb.engine.inputs.prompts import encode_prompt, render_chat
    from mlx_nb.engine.inputs.vision import render_vision_prompt
    from mlx_nb.engine.sampling.constrained import Constraint, closed, tool_call
    from mlx_nb.engine.scheduling.loop import EngineClosedError
    from mlx_nb.engine.scheduling.memory import default_prefix_budget, physical_memory
    from mlx_nb.engine.submit_request import SubmitRequest
    from mlx_nb.engine.types import (
        ContextOverflowError,
        Delta,
        Request,
        RequestError,
        Result,
        SamplingParams,
        TokenLogprob,
        TooLargeError,
        Usage,
        first_line,
    )
