"""A loaded model and the error a load raises: what the loader (text) and vision.py (vision)
both make, in a module of its own so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


class ModelLoadError(ValueError):
    """A model directory that exists but cannot be loaded; the message says why."""


@dataclass
class LoadedModel:
    name: str
    path: Path
    kind: str  # "text" or "vision"
    model: Any  # the module BatchGenerator drives (the language model for a vision model)
    tokenizer: Any  # mlx_lm TokenizerWrapper
    config: dict
    processor: Any = None  # mlx_vlm processor for vision models
    vision_model: Any = None  # the full mlx_vlm model (vision tower + language model)
    dtype: str = "native"
    kernels: Optional[dict] = None  # what mlx_nb.kernels.swap put on the kernels, and what it left
    formats: Optional[dict] = None  # a GGUF's tensors by block type, as held (models/gguf_load.py)
    weights: dict = field(default_factory=dict)  # {"formats": {format: tensors}, "bytes": n} (loader.weights_held)
    sampling: dict = field(default_factory=dict)  # the model's recommended sampling (sampling_defaults.read)
    sequential: Optional[str] = None  # why the model itself can only serve one request at a time

    @property
    def whole_model(self) -> Any:
        """Every weight the model holds: the full vision model for a vision model, else the model."""
        return self.vision_model if self.vision_model is not None else self.model

    @property
    def context_length(self) -> int:
        cfg = self.config.get("text_config", self.config)
        for key in ("max_position_embeddings", "context_length", "max_sequence_length"):
            if isinstance(cfg.get(key), int):
                return cfg[key]
        return 4096

    @property
    def vocab_size(self) -> Optional[int]:
        """Rows of the output layer: the token ids a logit bias may name (None if the config hides it)."""
        cfg = self.config.get("text_config", self.config)
        return cfg.get("vocab_size") if isinstance(cfg.get("vocab_size"), int) else None

    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    def cache_types(self) -> list:
        """Per layer, the cache class name (a list of names for a CacheList)."""
        from mlx_nb.models.cache_types import cache_type_name

        return [cache_type_name(c) for c in self.make_cache()]
