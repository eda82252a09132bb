"""The quantized KV cache at long context: a 16k-token conversation on the default model (turns drawn
from bench/data/quality_text.txt) read with float, 8-bit and 4-bit keys and values; perplexity over
every token, bytes the cache holds, the time the read took, and one decode step's time at that
context (the mean of 16 steps after a warm-up).

    python bench/kv_quant.py [--tokens 16384] [--out bench/results]

Writes kv_quant.json and kv_quant.md. The suite checks the same at 2k tokens
(tests/engine/test_engine_kv_quant_quality.py)."""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import mlx_nb  # noqa: F401  (before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache

from mlx_nb.engine.caches.kv_quant import BatchQuantizedKV
from mlx_nb.models import load_model

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "engine"))
from test_engine_kv_quant_quality import MODEL, conversation  # noqa: E402

CHUNK = 512


def run(model, ids: list[int], caches: list) -> dict:
    x = mx.array(ids)[None]
    nll, started = 0.0, time.perf_counter()
    for a in range(0, len(ids) - 1, CHUNK):
        b = min(len(ids) - 1, a + CHUNK)
        logits = model(x[:, a:b], cache=caches)[0].astype(mx.float32)
        nll += nn.losses.cross_entropy(logits, x[0, a + 1:b + 1], reduction="sum").item()
    read_s = time.perf_counter() - started
    token = x[:, -1:]
    for _ in range(4):  # warm-up
        mx.eval(model(token, cache=caches))
    started = time.perf_counter()
    for _ in range(16):
        mx.eval(model(token, cache=caches))
    step_s = (time.perf_counter() - started) / 16
    return {"perplexity": math.exp(nll / (len(ids) - 1)), "kv_bytes": sum(c.nbytes for c in caches),
            "read_s": round(read_s, 1), "decode_step_ms": round(step_s * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    loaded = load_model(MODEL)
    ids = conversation(loaded.tokenizer, args.tokens + 1, seed=1)
    layers = len(loaded.make_cache())
    results = {}
    for name, make in (("float", lambda: BatchKVCache([0])), ("8-bit", lambda: BatchQuantizedKV([0], 64, 8)),
                       ("4-bit", lambda: BatchQuantizedKV([0], 64, 4))):
        results[name] = run(loaded.model, ids, [make() for _ in range(layers)])
        print(name, results[name], flush=True)
    base = results["float"]
    lines = [
        "# Quantized KV cache at long context", "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.platform()}. Model {MODEL} on the CPU "
        f"kernels (float32 activations, so float keys and values are float32). A {len(ids) - 1}-token conversation "
        f"(`bench/kv_quant.py`: turns of bench/data/quality_text.txt) read in chunks of {CHUNK}, each chunk "
        "attending to the keys and values stored so far; group size 64.", "",
        "| keys and values | perplexity | vs float | KV bytes | vs float | read (s) | decode step at this context (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['perplexity']:.4f} | {r['perplexity'] / base['perplexity'] - 1:+.2%} | "
                     f"{r['kv_bytes'] / 2**20:.0f} MiB | {r['kv_bytes'] / base['kv_bytes']:.1%} | {r['read_s']} | "
                     f"{r['decode_step_ms']} |")
    lines += ["", "Against float16 keys and values (half the float32 bytes), 8-bit holds "
              f"{2 * results['8-bit']['kv_bytes'] / base['kv_bytes']:.1%} and 4-bit "
              f"{2 * results['4-bit']['kv_bytes'] / base['kv_bytes']:.1%} (the scales and biases are float32)."]
    out = Path(args.out)
    (out / "kv_quant.json").write_text(json.dumps({"tokens": len(ids) - 1, "model": MODEL, **results}, indent=2))
    (out / "kv_quant.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
