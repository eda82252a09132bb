"""The quantization types people download, side by side with llama.cpp's llama-server: the
Llama-3.2-1B-shaped GGUF (bench/real_models.py) quantized by llama-quantize to each common type,
both servers up at once on the same file, their runs taking turns at 1 and 8 concurrent streams.

    python bench/quant_types.py [--kinds Q4_K_M,Q5_K_M,Q6_K,Q8_0,Q4_0] [--out bench/results] [--report-only]

Writes quant-types.json and quant-types.md. Needs llama.cpp's tools (LLAMA_CPP_BIN), as the real-size
section of bench/run.py does; the files are cached under $MLX_NB_HOME/bench.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402,F401  (before mlx)

import real_models  # noqa: E402
import servers  # noqa: E402
from run import measure_side_by_side  # noqa: E402

MODEL = "llama-3.2-1b"
KINDS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
LEVELS = (1, 8)


def measure(kind: str, max_tokens: int, reps: int, logs: Path) -> dict:
    path = real_models.shaped(MODEL, kind)
    print(f"{kind}: {path.name}", flush=True)
    with servers.mlx_nb_server(str(path), log=logs / f"mlx-nb-{MODEL}-{kind}.log") as ours, \
            servers.llama_server(path, log=logs / f"llama-server-{MODEL}-{kind}.log") as cpp:
        ours_runs, cpp_runs = measure_side_by_side([ours, cpp], list(LEVELS), max_tokens, reps)
    return {"file": path.name, "file_bytes": path.stat().st_size,
            "ours": ours_runs["levels"], "llama_server": cpp_runs["levels"]}


def report(data: dict) -> str:
    lines = [
        "# The common GGUF quantization types beside llama-server", "",
        f"{data['date']}, {data['platform']}, {data['cpus']} CPUs. The {MODEL}-shaped GGUF (random weights in "
        "the real layout and vocabulary size, bench/real_models.py) quantized by llama.cpp's llama-quantize to "
        f"each type; greedy, {data['max_tokens']} new tokens a request, streaming through the openai SDK; "
        f"aggregate tokens/s, the median of {data['reps']} cold runs, the two servers' runs taking turns.", "",
        "| type | file | mlx-nb N=1 | llama-server N=1 | ratio | mlx-nb N=8 | llama-server N=8 | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in data["kinds"].items():
        row = [kind, f"{r['file_bytes'] / 2**20:.0f} MiB"]
        for level in LEVELS:
            a, b = (r[who][str(level)]["agg_tps"] for who in ("ours", "llama_server"))
            row += [f"{a:.1f}", f"{b:.1f}", f"**{a / b:.2f}x**"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "bench/run.py's real-size section measures Q4_K_M at 1B and 3B at 32 streams too, with prompt "
              "reading and memory ([latest.md](latest.md))."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--report-only", action="store_true", help="rewrite quant-types.md from quant-types.json")
    args = parser.parse_args()
    out = Path(args.out)
    if args.report_only:
        (out / "quant-types.md").write_text(report(json.loads((out / "quant-types.json").read_text())))
        return
    if servers.llama_server_binary() is None:
        raise SystemExit("llama-server not found: set LLAMA_CPP_BIN (see bench/servers.py)")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    kinds = {k: measure(k, args.max_tokens, args.reps, logs) for k in args.kinds.split(",") if k}
    data = json.loads(json.dumps({  # levels as strings, as they read back from the JSON
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "platform": platform.platform(),
        "cpus": os.cpu_count(), "max_tokens": args.max_tokens, "reps": args.reps, "kinds": kinds}))
    (out / "quant-types.json").write_text(json.dumps(data, indent=2))
    (out / "quant-types.md").write_text(report(data))
    print(report(data))


if __name__ == "__main__":
    main()
