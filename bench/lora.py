"""What a LoRA adapter per request costs in the shared batch: decode tokens/s with no adapter, with
every row on one adapter, and with half the rows on each of two adapters, at 1 and 8 streams.

    .venv/bin/python bench/lora.py    # writes bench/results/lora.{json,md}

In-process Engine (the same batch a server runs). Each adapter adapts every linear projection of
every layer at rank 8 (mlx_lm's default keys: the most an adapter can cost). Short prompts, the
end of text barred, so every row decodes its whole budget. The variants take turns within each
repetition (the box is shared: ratios within one run); medians of REPS.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

MODELS = {"SmolLM2-135M Q4_1 (default)": "smollm2-135m-instruct",
          "Llama-3.2-1B shape Q4_K_M": str(Path.home() / ".cache/mlx_nb/bench/llama-3.2-1b-Q4_K_M.gguf")}
STREAMS = (1, 8)
TOKENS = 96
REPS = 3
RANK = 8


def write_adapter(loaded, out: Path, seed: int) -> Path:
    """An adapter of every projection of every layer for `loaded`'s architecture, written as
    mlx_lm.lora writes one (its LoRA layers over a lazily built copy of the model: no weights made)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    arch = importlib.import_module(type(loaded.model).__module__)
    model = arch.Model(loaded.model.args)
    model.freeze()
    params = {"rank": RANK, "scale": 8.0, "dropout": 0.0}
    linear_to_lora_layers(model, len(model.layers), params)
    rng = np.random.default_rng(seed)
    weights = {k: mx.array(rng.normal(0, 0.01, v.shape).astype(np.float32))
               for k, v in tree_flatten(model.trainable_parameters())}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    (out / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "lora", "num_layers": len(model.layers),
                                                          "lora_parameters": params}))
    return out


def decode_rate(engine, streams: int, adapters: list) -> float:
    """Tokens/s of `streams` rows decoding together, row i with adapters[i % len(adapters)]."""
    bar = {t: -100 for t in engine.loaded.tokenizer.eos_token_ids}
    handles = [engine.submit(prompt=f"Row {i}: write about the sea.", max_tokens=TOKENS, logit_bias=bar,
                             adapter=adapters[i % len(adapters)]) for i in range(streams)]
    first = None
    for h in handles[:1]:
        for _ in h:
            first = time.perf_counter()
            break
    results = [h.result(timeout=600) for h in handles]
    end = time.perf_counter()
    return (sum(r.usage.completion_tokens for r in results) - streams) / (end - first)


def main() -> int:
    from mlx_nb import Engine

    variants = {"no adapter": [None], "every row one adapter": ["a"], "half the rows each of two": ["a", "b"]}
    out = {"tokens": TOKENS, "reps": REPS, "rank": RANK, "models": {}}
    for label, source in MODELS.items():
        if not source.endswith(".gguf") or Path(source).exists():
            with Engine(source, prefix_cache=False, wait=True) as engine:
                with tempfile.TemporaryDirectory() as tmp:
                    for i, name in enumerate("ab"):
                        engine.load_adapter(name, str(write_adapter(engine.loaded, Path(tmp) / name, i)))
                decode_rate(engine, 2, ["a", None])  # warm-up
                rates = {n: {v: [] for v in variants} for n in STREAMS}
                for _ in range(REPS):
                    for n in STREAMS:
                        for v, adapters in variants.items():
                            rates[n][v].append(decode_rate(engine, n, adapters))
                med = {n: {v: statistics.median(r) for v, r in by.items()} for n, by in rates.items()}
                out["models"][label] = {"median_tokens_per_s": med, "runs": rates,
                                        "adapter_bytes": engine.adapter_bytes // 2}
                print(label, json.dumps(med), flush=True)
    results = HERE / "results"
    (results / "lora.json").write_text(json.dumps(out, indent=2))
    lines = ["# LoRA adapters per request: decode cost in the shared batch", "",
             f"Rank {RANK} on every projection of every layer; {TOKENS} tokens a row; median of {REPS} "
             "(variants interleaved). Tokens/s of the whole batch, and the ratio to no adapter.", "",
             "| model | streams | no adapter | every row one adapter | half the rows each of two |",
             "|---|---|---|---|---|"]
    for label, m in out["models"].items():
        for n in STREAMS:
            med = m["median_tokens_per_s"][n]
            base = med["no adapter"]
            cells = [f"{med[v]:.1f} ({med[v] / base:.2f}x)" for v in variants]
            lines.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
    (results / "lora.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
