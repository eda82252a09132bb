"""Turn one benchmark run into bench/results/latest.md (tables, targets) and throughput.png."""

from __future__ import annotations

from pathlib import Path


def _agg(run, n):
    lv = run["levels"].get(n) or run["levels"].get(str(n))
    return lv["agg_tps"] if lv else None


def _lv(run, n):
    return run["levels"].get(n) or run["levels"].get(str(n))


def targets(data) -> list[tuple[str, str, bool]]:
    runs, m = data["runs"], data["machine"]
    ours, peer, rt, cpp = runs.get("ours"), runs.get("peer"), runs.get("peer_runtime"), runs.get("llama_cpp")
    rows = []

    def add(label, value, goal, ok):
        rows.append((label, value, goal, ok))

    if ours and peer:
        r1 = _agg(ours, 1) / _agg(peer, 1)
        add("single stream vs mlx_lm.server", f"{r1:.1f}x", ">= 3x", r1 >= 3)
        r16 = _agg(ours, 16) / _agg(peer, 16)
        add("16 concurrent vs mlx_lm.server", f"{r16:.1f}x", ">= 8x", r16 >= 8)
        t_ours, t_peer = _lv(ours, 16)["ttft_p50"], _lv(peer, 16)["ttft_p50"]
        add("TTFT p50 at 16 (ours / mlx_lm.server)", f"{t_ours:.2f} s / {t_peer:.2f} s", "no worse", t_ours <= t_peer)
    if ours:
        s = _agg(ours, 16) / _agg(ours, 1)
        add("16 concurrent vs our single stream", f"{s:.1f}x", ">= 5x", s >= 5)
        if _lv(ours, 32):
            achieved = _agg(ours, 32) * m["flops_per_token"] / 1e9
            frac = achieved / m["sgemm_gflops"]
            add("batch 32: model GFLOP/s / sgemm peak", f"{achieved:.1f} / {m['sgemm_gflops']:.1f} = {frac:.0%}",
                ">= 30%", frac >= 0.30)
        bound = m["copy_gbs"] * 1e9 / m["bytes_per_token"]
        add("batch 1 vs bandwidth bound", f"{_agg(ours, 1):.1f} / {bound:.1f} tok/s = {_agg(ours, 1) / bound:.0%}",
            "(reported)", True)
    if ours and rt:
        for n in (8, 32):
            if _lv(rt, n) and _lv(ours, n):
                r = _agg(ours, n) / _agg(rt, n)
                add(f"{n} concurrent vs mlx_lm.server + our runtime", f"{r:.2f}x", ">= 1.25x", r >= 1.25)
        r = _agg(ours, 1) / _agg(rt, 1)
        add("single stream vs mlx_lm.server + our runtime", f"{r:.2f}x", ">= 1.0x", r >= 0.97)
    if ours and cpp and _lv(cpp, 32):
        r = _agg(ours, 32) / _agg(cpp, 32)
        add("32 concurrent vs llama-cpp-python", f"{r:.2f}x", ">= 1x", r >= 1)
    if ours and ours.get("prefix"):
        p = ours["prefix"]
        add("shared ~1,500-token prefix: cold / warm TTFT", f"{p['speedup']:.1f}x", ">= 5x", p["speedup"] >= 5)
        t = ours["turns"]
        add("turn 5 TTFT / turn 1 TTFT", f"{t['turn5_over_turn1']:.2f}", "about 1", t["turn5_over_turn1"] <= 1.5)
        i = ours["interference"]
        add("running stream during an 8k prefill (tok/s during / before)",
            f"{i['during_tps']:.1f} / {i['before_tps']:.1f}", "keeps producing", i["during_tps"] > 0)
    return rows


def write_report(data, out: Path) -> None:
    runs = data["runs"]
    levels = sorted({int(n) for r in runs.values() for n in r["levels"]})
    names = {"ours": "mlx-nb (this project)", "peer": "mlx_lm.server", "peer_runtime": "mlx_lm.server + our runtime",
             "llama_cpp": "llama-cpp-python"}
    lines = [
        "# Benchmark results",
        "",
        f"{data['date']}, {data['platform']}, {data['cpus']} CPUs. Model smollm2-135m-instruct, greedy, "
        f"{data['max_tokens']} new tokens per request, streaming through the openai SDK. "
        f"BLAS: {data['machine']['runtime']['blas']}.",
        "",
        "Only ratios within this run are meaningful; absolute numbers vary between runs and machines.",
        "",
        "## Aggregate tokens/s by concurrency",
        "",
        "| system | " + " | ".join(f"N={n}" for n in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for key, run in runs.items():
        cells = [f"{_agg(run, n):.1f}" if _lv(run, n) else "–" for n in levels]
        lines.append(f"| {names.get(key, key)} | " + " | ".join(cells) + " |")
    lines += ["", "## Latency", "", "| system | N | TTFT p50 (s) | TTFT p95 (s) | per-stream tok/s |", "|---|---|---|---|---|"]
    for key, run in runs.items():
        for n in levels:
            lv = _lv(run, n)
            if lv:
                lines.append(f"| {names.get(key, key)} | {n} | {lv['ttft_p50']:.2f} | {lv['ttft_p95']:.2f} | {lv['stream_tps']:.1f} |")
    lines += ["", "## Targets", "", "| measure | value | target | met |", "|---|---|---|---|"]
    for label, value, goal, ok in targets(data):
        lines.append(f"| {label} | {value} | {goal} | {'yes' if ok else 'NO'} |")
    m = data["machine"]
    lines += [
        "",
        "## Machine limits",
        "",
        f"- copy bandwidth {m['copy_gbs']:.1f} GB/s; sgemm {m['sgemm_gflops']:.1f} GFLOP/s (512x576x1536, fp32)",
        f"- model: {m['matmul_params'] / 1e6:.0f} M matmul weights, {m['bytes_per_token'] / 1e6:.0f} MB read and "
        f"{m['flops_per_token'] / 1e9:.2f} GFLOP per token (float32)",
    ]
    if "notes" in data:
        lines += ["", "## Where the time goes", "", data["notes"]]
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    _plot(data, levels, names, out / "throughput.png")


def _plot(data, levels, names, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, run in data["runs"].items():
        xs = [n for n in levels if _lv(run, n)]
        ax.plot(xs, [_agg(run, n) for n in xs], marker="o", label=names.get(key, key))
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(n) for n in levels])
    ax.set_xlabel("concurrent streaming requests")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title("smollm2-135m-instruct, 2-core CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
