"""LoRA adapter folders made as mlx_lm.lora makes them (its own `linear_to_lora_layers`, its
trainable parameters saved), with seeded random low-rank pairs in place of training, and the
reference an adapter's replies must equal: mlx_lm's `load(..., adapter_path=...)` decoding one
request at a time through `generate_step`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np


def make_adapter(model_path, out: Path, seed: int, rank: int = 4, scale: float = 8.0, num_layers: int = -1,
                 keys: Optional[list] = None) -> Path:
    """An adapter folder for the model at `model_path` (all linear projections of the last
    `num_layers` layers unless `keys` names some, as mlx_lm's defaults)."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = mlx_lm.load(str(model_path))
    model.freeze()
    layers = len(model.layers) if num_layers < 0 else num_layers
    params = {"rank": rank, "scale": scale, "dropout": 0.0, **({"keys": keys} if keys else {})}
    linear_to_lora_layers(model, layers, params)
    rng = np.random.default_rng(seed)
    weights = {}
    for key, value in tree_flatten(model.trainable_parameters()):
        # large enough to change the greedy tokens (mlx_lm starts lora_b at zero)
        weights[key] = mx.array(rng.normal(0.0, 0.5 if key.endswith("lora_b") else 0.2, size=value.shape)
                                .astype(np.float32))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    config = {"fine_tune_type": "lora", "num_layers": layers, "lora_parameters": params, "model": str(model_path)}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def adapter_reference(model_path, adapter_path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """mlx_lm's greedy tokens for each prompt alone with the adapter (None: the base model), end
    of sequence dropped, as an engine Result's token_ids hold them."""
    import mlx_lm

    from mlx_nb.compat.reference import reply_tokens

    model, tokenizer = mlx_lm.load(str(model_path), adapter_path=None if adapter_path is None else str(adapter_path))

    class Loaded:  # what reply_tokens reads
        pass

    loaded = Loaded()
    loaded.model, loaded.tokenizer = model, tokenizer
    return [reply_tokens(loaded, p, max_tokens) for p in prompts]
