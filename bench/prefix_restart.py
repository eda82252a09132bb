"""A long prompt after a restart: the first token from the prefix cache on disk, against a warm hit.

    .venv/bin/python bench/prefix_restart.py    # writes bench/results/prefix-restart.{json,md}

One server of the default model keeps its prefix cache in a fresh folder. A 4k-token prompt is
read cold, then asked again (a warm hit in memory); the server is stopped (it writes the cache at
close) and started again on the same folder, and the same prompt is asked: the disk hit. Each time
a different last question, so only the long part is shared. Repeated REPS times; medians.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

import prefix  # noqa: E402
import servers  # noqa: E402
from workload import client, one_chat  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT_TOKENS = 4000
REPS = 3


def ttft(server, notes: str, question: str):
    return one_chat(client(server), server.model, f"{notes}\n\n{question}", 8)


def main() -> int:
    from mlx_nb.models import load_model

    notes = prefix.text_of(load_model(MODEL).tokenizer, PROMPT_TOKENS)
    runs = []
    for rep in range(REPS):
        folder = tempfile.mkdtemp(prefix="mlx-nb-prefix-")
        option = f"--MLXExtension.prefix_cache_dir={folder}"
        text = f"(notes {rep})\n{notes}"  # a prompt no earlier repetition stored
        with servers.mlx_nb_server(MODEL, None, option) as server:
            ttft(server, "warm-up", "Say hi.")
            cold = ttft(server, text, "Summarise the notes in one line.")
            warm = ttft(server, text, "What is due next? One line.")
        with servers.mlx_nb_server(MODEL, None, option) as server:
            ttft(server, "warm-up", "Say hi.")
            disk = ttft(server, text, "Who reviewed the figures? One line.")
            again = ttft(server, text, "When is the budget revisited? One line.")
        runs.append({"prompt_tokens": cold.prompt_tokens, "cold_s": cold.ttft, "warm_s": warm.ttft,
                     "after_restart_s": disk.ttft, "second_after_restart_s": again.ttft})
        print(runs[-1], flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in ("cold_s", "warm_s", "after_restart_s",
                                                            "second_after_restart_s")}
    out = {"model": MODEL, "prompt_tokens": runs[0]["prompt_tokens"], "reps": REPS, "median": med, "runs": runs,
           "restart_over_warm": med["after_restart_s"] / med["warm_s"],
           "cold_over_restart": med["cold_s"] / med["after_restart_s"]}
    results = HERE / "results"
    (results / "prefix-restart.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# A long prompt after a restart", "",
             f"{MODEL}, a {out['prompt_tokens']}-token prompt, time to first token, median of {REPS} "
             "(bench/prefix_restart.py).", "",
             "| read | first token (s) | vs warm |", "|---|---|---|"]
    for label, key in (("cold (nothing cached)", "cold_s"), ("warm (prefix cache in memory)", "warm_s"),
                       ("after a restart (prefix cache read from disk)", "after_restart_s"),
                       ("after a restart, asked again (in memory again)", "second_after_restart_s")):
        lines.append(f"| {label} | {med[key]:.3f} | {med[key] / med['warm_s']:.2f}x |")
    (results / "prefix-restart.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
