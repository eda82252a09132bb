"""Prompt-lookup speculation, on and off, in one run: an editing workload (the prompt holds code the
answer repeats with a change, as a coding agent's edits do) and a free-text one, at 1 and 32 streams.

    .venv/bin/python bench/speculation.py    # writes bench/results/speculation.{json,md}

Two in-process Engines of the same model, one with `speculation=False`, take turns (the box is
shared: ratios within one run). Greedy, so both must give the same tokens (checked). Tokens/s of
decoding: from each batch's first token to its last; medians of REPS.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

MODEL = "smollm2-135m-instruct"
TOKENS = 200
REPS = 3
STREAMS = (1, 32)

SNIPPETS = [
    ("total", "grand_total", '''def summarize(records):
    total = 0
    count = 0
    for record in records:
        if record.get("valid"):
            total += record["amount"]
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}
'''),
    ("items", "entries", '''class Basket:
    def __init__(self):
        self.items = []

    def add(self, name, price, quantity=1):
        self.items.append({"name": name, "price": price, "quantity": quantity})

    def total(self):
        return sum(item["price"] * item["quantity"] for item in self.items)

    def names(self):
        return [item["name"] for item in self.items]
'''),
    ("path", "source", '''def read_config(path):
    with open(path) as handle:
        lines = handle.read().splitlines()
    config = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        config[key.strip()] = value.strip()
    return config
'''),
]
TOPICS = ["a lighthouse keeper who finds a message in a bottle", "the history of the bicycle",
          "why the sky is blue, for a child", "a recipe for bread, step by step"]


def edit_messages(i: int) -> list:
    old, new, code = SNIPPETS[i % len(SNIPPETS)]
    return [{"role": "user", "content": f"{code}\nRewrite the code above exactly as it is, but rename `{old}` to "
                                        f"`{new}` everywhere. Reply with the code only."}]


def free_messages(i: int) -> list:
    return [{"role": "user", "content": f"Write a short essay about {TOPICS[i % len(TOPICS)]}."}]


def run(engine, streams: int, messages) -> tuple[float, list]:
    handles = [engine.submit(messages=messages(i), max_tokens=TOKENS) for i in range(streams)]
    next(iter(handles[0]))
    first = time.perf_counter()
    results = [h.result(timeout=1200) for h in handles]
    spent = time.perf_counter() - first
    return (sum(r.usage.completion_tokens for r in results) - 1) / spent, [r.token_ids for r in results]


def main() -> int:
    from mlx_nb import Engine

    engines = {"on": Engine(MODEL, prefix_cache=False, wait=True),
               "off": Engine(MODEL, prefix_cache=False, speculation=False, wait=True)}
    workloads = {"editing": edit_messages, "free text": free_messages}
    for e in engines.values():
        run(e, 2, edit_messages)  # warm-up
    rates = {w: {n: {k: [] for k in engines} for n in STREAMS} for w in workloads}
    same = True
    for _ in range(REPS):
        for w, messages in workloads.items():
            for n in STREAMS:
                outputs = {}
                for k, e in engines.items():
                    rate, outputs[k] = run(e, n, messages)
                    rates[w][n][k].append(rate)
                same &= outputs["on"] == outputs["off"]
    spec = engines["on"].status()["speculation"]
    for e in engines.values():
        e.close()
    med = {w: {n: {k: statistics.median(v) for k, v in by.items()} for n, by in ns.items()} for w, ns in rates.items()}
    out = {"model": MODEL, "tokens": TOKENS, "reps": REPS, "identical_outputs": same, "median_tokens_per_s": med,
           "runs": rates, "speculation": spec}
    results = HERE / "results"
    (results / "speculation.json").write_text(json.dumps(out, indent=2))
    lines = ["# Prompt-lookup speculation in the shared batch", "",
             f"{MODEL}, greedy, {TOKENS} tokens a row, median of {REPS} (on and off interleaved). Decode tokens/s "
             "of the whole batch. Outputs with and without speculation identical: "
             f"**{'yes' if same else 'NO'}**.", "",
             "| workload | streams | off | on | on / off |", "|---|---|---|---|---|"]
    for w, ns in med.items():
        for n, r in ns.items():
            lines.append(f"| {w} | {n} | {r['off']:.1f} | {r['on']:.1f} | **{r['on'] / r['off']:.2f}x** |")
    lines += ["", f"Over the run: {spec['proposed_tokens']} tokens proposed, {spec['accepted_tokens']} accepted "
              f"({spec['acceptance']}), in {spec['speculative_steps']} of {spec['steps']} decode steps."]
    (results / "speculation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
