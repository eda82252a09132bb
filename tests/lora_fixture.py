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


MAX_TOKENS = 12


def prompts_of(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(str(x) for x in rng.integers(0, 99, size=rng.integers(1, 14))) for _ in range(n)]


def mixed_batch(model_path: Path, adapters: dict, seed: int, engine_kwargs: dict) -> None:
    """Random prompts, each naming a random adapter or none, submitted together: every reply is
    mlx_lm's with that adapter alone, and the adapters do change the replies."""
    from mlx_nb import Engine
    from mlx_nb.engine.inputs.prompts import encode_prompt
    from mlx_nb.models import load_model

    rng = np.random.default_rng(seed)
    texts = prompts_of(seed, 10)
    names = [None, *adapters, *rng.choice([None, *adapters], size=len(texts) - 1 - len(adapters)).tolist()]
    tokenizer = load_model(str(model_path)).tokenizer
    prompts = [encode_prompt(tokenizer, t, chat=False) for t in texts]
    want = {}
    for name in [None, *adapters]:
        mine = [i for i, n in enumerate(names) if n == name]
        if mine:
            got = adapter_reference(model_path, adapters.get(name), [prompts[i] for i in mine], MAX_TOKENS)
            want.update(zip(mine, got))
    base = adapter_reference(model_path, None, prompts, MAX_TOKENS)
    assert sum(want[i] != base[i] for i, n in enumerate(names) if n is not None) >= 2, "the adapters change nothing"
    with Engine(str(model_path), wait=True, **engine_kwargs) as engine:
        for name, folder in adapters.items():
            engine.load_adapter(name, str(folder))
        handles = [engine.submit(prompt=t, max_tokens=MAX_TOKENS, adapter=n) for t, n in zip(texts, names)]
        got = [h.result(timeout=180) for h in handles]
        assert engine.status()["peak_batch_size"] > 1
    for i, (r, n) in enumerate(zip(got, names)):
        assert r.error is None, r.error
        assert r.token_ids == want[i], (i, n)
