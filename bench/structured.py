"""What constrained decoding costs the shared batch: a batch of 8 on the default model with 0, 1
and 8 rows held to a JSON schema, decode tokens/s of the whole batch, measured in one run.

    .venv/bin/python bench/structured.py    # writes bench/results/structured.md and structured.json

Every row writes exactly BUDGET tokens: free rows have their end-of-sequence token pushed down,
constrained rows follow a schema whose one string must be longer than the budget, so the three
configurations do the same work but for the masks. The configurations take turns, REPS times; the
median is reported. Also the time spent in the grammar processors themselves (the per-row mask).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)
from mlx_nb.engine.sampling import constrained  # noqa: E402

MODEL = "smollm2-135m-instruct"
ROWS, BUDGET, REPS = 8, 96, 5
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}}, "required": ["story"]}
CHAT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


class Timed:
    """Wall time spent inside GrammarProcessor calls (the masks), summed."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0
        self.original = constrained.GrammarProcessor.__call__

        def timed(proc, tokens, logits):
            started = time.perf_counter()
            out = self.original(proc, tokens, logits)
            self.seconds += time.perf_counter() - started
            self.calls += 1
            return out

        constrained.GrammarProcessor.__call__ = timed


def run(engine, constrained_rows: int) -> float:
    from mlx_nb.api.constraint_fields import constraint_of

    eos = {t: -100 for t in engine.loaded.tokenizer.eos_token_ids}
    fmt = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}
    handles = []
    for i in range(ROWS):
        kw = {"constraint": constraint_of(fmt)} if i < constrained_rows else {"logit_bias": eos}
        handles.append(engine.submit(messages=CHAT, max_tokens=BUDGET, temperature=0.7, seed=i, **kw))
    first: list = [None] * ROWS

    def read(i: int) -> None:  # each stream on its own thread: a first token is timed when it comes
        for delta in handles[i]:
            if delta.token_ids and first[i] is None:
                first[i] = time.perf_counter()

    readers = [threading.Thread(target=read, args=(i,)) for i in range(ROWS)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    ended = time.perf_counter()
    results = [h.result() for h in handles]
    assert all(r.usage.completion_tokens == BUDGET for r in results), [r.usage.completion_tokens for r in results]
    return ROWS * (BUDGET - 1) / (ended - max(first))  # from the last row's first token: all decode


def main() -> int:
    from mlx_nb import Engine

    timer = Timed()
    configs = (0, 1, ROWS)
    rates: dict[int, list[float]] = {c: [] for c in configs}
    mask_s: dict[int, float] = {}
    with Engine(MODEL, wait=True) as engine:
        run(engine, ROWS)  # warm up: kernels compiled, the tokenizer's digit table built
        for _ in range(REPS):
            for c in configs:
                before_s, before_n = timer.seconds, timer.calls
                rates[c].append(run(engine, c))
                if c:
                    mask_s[c] = (timer.seconds - before_s) / max(1, timer.calls - before_n)
    medians = {c: statistics.median(v) for c, v in rates.items()}
    out = {"model": MODEL, "rows": ROWS, "budget": BUDGET, "reps": REPS,
           "tokens_per_s": {str(c): medians[c] for c in configs},
           "all_runs": {str(c): rates[c] for c in configs},
           "mask_ms_per_row_step": {str(c): mask_s.get(c, 0.0) * 1000 for c in configs if c}}
    results = HERE / "results"
    (results / "structured.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# Constrained rows in a batch of 8", "",
             f"{MODEL}, batch of {ROWS}, {BUDGET} tokens a row, median of {REPS} alternating runs "
             "(bench/structured.py).", "",
             "| constrained rows | batch tokens/s | vs none | mask ms per row and step |", "|---|---|---|---|"]
    for c in configs:
        mask = f"{mask_s[c] * 1000:.3f}" if c else "–"
        lines.append(f"| {c} | {medians[c]:.1f} | {medians[c] / medians[0]:.2f}x | {mask} |")
    (results / "structured.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
