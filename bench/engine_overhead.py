"""The engine's own cost: steady-state decode tokens/s through the Engine vs the bare forward pass.

    .venv/bin/python bench/engine_overhead.py     # appends a table to bench/results/engine_overhead.md

Forward-only: the model alone, a batch cache of B rows, one token per row per step, argmax, eval.
Engine: B chats decoding together; rate taken from the engine's own step events while all B rows
are in the batch (prefill excluded), so both numbers measure the same thing. (A logits processor
to forbid EOS would add per-row work to every step, so rows are simply asked for long stories.)
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import mlx_nb  # noqa: F401  (fast BLAS before MLX)

MODEL = "smollm2-135m-instruct"
LEVELS = (1, 8, 32)


def forward_only(loaded, b: int, steps: int = 32) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    model = loaded.model
    cache = [BatchKVCache([0] * b) for _ in loaded.make_cache()]
    mx.eval(model(mx.ones((b, 24), dtype=mx.int32), cache=cache))
    tok = mx.ones((b, 1), dtype=mx.int32)
    for _ in range(3):
        mx.eval(model(tok, cache=cache))
    t = time.perf_counter()
    for _ in range(steps):
        tok = mx.argmax(model(tok, cache=cache)[:, -1:, :], axis=-1).astype(mx.int32)
        mx.eval(tok)
    return b * steps / (time.perf_counter() - t)


def engine_decode(engine, b: int) -> float:
    since = engine.events()[-1]["seq"] if engine.events() else 0
    handles = [engine.submit(messages=[{"role": "user", "content": f"Tell a long story, part {i}."}],
                             max_tokens=64) for i in range(b)]
    for h in handles:
        h.result()
    full = [e for e in engine.events(since) if e["kind"] == "step" and len(e["requests"]) == b]
    return b * (len(full) - 1) / (full[-1]["time"] - full[0]["time"])


def main() -> None:
    from mlx_nb import Engine
    from mlx_nb.models import load_model

    loaded = load_model(MODEL)
    fwd = {b: forward_only(loaded, b) for b in LEVELS}
    del loaded
    with Engine(MODEL, prefix_cache=False, max_batch=64, wait=True) as engine:
        engine.submit(prompt="warm up", max_tokens=8).result()
        eng = {b: engine_decode(engine, b) for b in LEVELS}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Engine overhead, {stamp} ({mlx_nb.runtime_info()['blas']})", "",
             "| batch | forward-only tok/s | engine tok/s | engine / forward |", "|---|---|---|---|"]
    for b in LEVELS:
        lines.append(f"| {b} | {fwd[b]:.1f} | {eng[b]:.1f} | {eng[b] / fwd[b]:.0%} |")
    out = Path(__file__).parent / "results" / "engine_overhead.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
