"""bench: embedding 10,000 sentences with the default embedder (all-MiniLM-L6-v2), as a notebook would.

    .venv/bin/python bench/embeddings.py [--sentences 10000]   # writes bench/results/embeddings.md (~2 min)

Measured in one process, one run: sentences/s of one `Embedder.embed` call over the whole list
(the embedder groups them by length into shared forwards), of the same sentences sent as 32
concurrent requests of 1 (many notebooks' small requests, batched by the embedder's thread), and
of one sentence at a time (no batching: the floor).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
WORDS = ("the a model notebook batch engine token vector search river city people data table row column "
         "quickly slowly computes reads writes shares learns ancient modern small large blue green").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(4, 40))).capitalize() + "." for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sentences", type=int, default=10_000)
    args = ap.parse_args()
    from mlx_nb.engine import Embedder

    data = sentences(args.sentences)
    with Embedder(wait=True) as e:
        e.embed(data[:64])  # warm up
        t0 = time.perf_counter()
        whole = e.embed(data)
        one_call = time.perf_counter() - t0
        forwards = e.forwards
        t0 = time.perf_counter()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda s: e.embed(s), data))
        concurrent = time.perf_counter() - t0
        concurrent_forwards = e.forwards - forwards
        sample = data[:500]
        t0 = time.perf_counter()
        for s in sample:
            e.embed(s)
        alone = (time.perf_counter() - t0) / len(sample) * len(data)
    out = {"sentences": len(data), "tokens": whole.tokens, "one_call_s": one_call,
           "one_call_sentences_per_s": len(data) / one_call, "one_call_tokens_per_s": whole.tokens / one_call,
           "concurrent_32_s": concurrent, "concurrent_32_sentences_per_s": len(data) / concurrent,
           "concurrent_32_forwards": concurrent_forwards, "one_at_a_time_sentences_per_s": len(data) / alone}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "embeddings.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Embedding sentences with all-MiniLM-L6-v2", "",
             f"Command: `.venv/bin/python bench/embeddings.py --sentences {args.sentences}` (one process, one run).",
             "", "| measure | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in out.items()]
    (RESULTS / "embeddings.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
