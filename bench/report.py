"""Turn one benchmark run into bench/results/latest.md (tables, targets), throughput.png and the
benchmark table of docs/benchmarks.md."""

from __future__ import annotations

import os
from pathlib import Path

NAMES = {"ours": "mlx-nb (this project)", "peer": "mlx_lm.server", "peer_runtime": "mlx_lm.server + our runtime",
         "llama_server": "llama.cpp llama-server (-np 32)", "llama_cpp": "llama-cpp-python"}
README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def _lv(run, n):
    return run["levels"].get(n) or run["levels"].get(str(n))


def _agg(run, n):
    lv = _lv(run, n)
    return lv["agg_tps"] if lv else None


def targets(data) -> list[tuple[str, str, str, bool]]:
    runs, m = data["runs"], data["machine"]
    ours, peer, rt, cpp = runs.get("ours"), runs.get("peer"), runs.get("peer_runtime"), runs.get("llama_server")
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
            add("32 concurrent (HTTP, prefill included): model GFLOP/s / sgemm peak",
                f"{achieved:.1f} / {m['sgemm_gflops']:.1f} = {frac:.0%}", ">= 30%", frac >= 0.30)
        steps = data.get("steps", {}).get("decode", {})
        b32 = steps.get(32) or steps.get("32")
        if b32:
            achieved = b32["engine_tps"] * m["flops_per_token"] / 1e9
            frac = achieved / m["sgemm_gflops"]
            add("batch 32 decode step (engine): model GFLOP/s / sgemm peak",
                f"{achieved:.1f} / {m['sgemm_gflops']:.1f} = {frac:.0%}", ">= 30%", frac >= 0.30)
        bound = m["copy_gbs"] * 1e9 / m["bytes_per_token"]
        add("single stream vs the bandwidth bound", f"{_agg(ours, 1):.1f} / {bound:.1f} tok/s = {_agg(ours, 1) / bound:.0%}",
            "(reported)", True)
    if ours and rt:
        for n in (8, 32):
            if _lv(rt, n) and _lv(ours, n):
                r = _agg(ours, n) / _agg(rt, n)
                add(f"{n} concurrent vs mlx_lm.server + our runtime", f"{r:.2f}x", ">= 1.25x", r >= 1.25)
        r = _agg(ours, 1) / _agg(rt, 1)
        add("single stream vs mlx_lm.server + our runtime", f"{r:.2f}x", ">= 1.0x", r >= 1.0)
    if ours and cpp:
        for n, goal in ((1, 1.0), (8, 1.3), (32, 1.3)):
            if _lv(cpp, n) and _lv(ours, n):
                r = _agg(ours, n) / _agg(cpp, n)
                add(f"{n} concurrent vs llama.cpp's llama-server", f"{r:.2f}x", f">= {goal}x", r >= goal)
        if _lv(cpp, 32) and _lv(ours, 32):
            t_ours, t_cpp = _lv(ours, 32)["ttft_p50"], _lv(cpp, 32)["ttft_p50"]
            add("TTFT p50 at 32 (ours / llama-server)", f"{t_ours:.2f} s / {t_cpp:.2f} s", "no worse", t_ours <= t_cpp)
        if ours.get("prompt_read") and cpp.get("prompt_read"):
            a, b = ours["prompt_read"], cpp["prompt_read"]
            r = a["prompt_tps"] / b["prompt_tps"]
            add(f"reading a {a['prompt_tokens']}-token prompt alone vs llama-server",
                f"{a['prompt_tps']:.0f} / {b['prompt_tps']:.0f} tok/s = {r:.2f}x", ">= 1.0x", r >= 1.0)
    if m.get("weights_bytes"):
        add("default model's weights as held", f"{m['weights_bytes'] / 1e6:.0f} MB ({m.get('dtype')})", "< 150 MB",
            m["weights_bytes"] < 150e6)
    if ours and ours.get("prefix"):
        p = ours["prefix"]
        add(f"shared {p['prompt_tokens']}-token prefix: cold / warm TTFT", f"{p['speedup']:.1f}x", ">= 5x",
            p["speedup"] >= 5)
        t = ours["turns"]
        add("turn 5 TTFT / turn 1 TTFT", f"{t['turn5_over_turn1']:.2f}", "about 1 (<= 1.5)", t["turn5_over_turn1"] <= 1.5)
        i = ours["interference"]
        add(f"running stream while a {i['prompt_tokens']}-token prompt is read: longest pause",
            f"{i['longest_pause_s']:.2f} s", "keeps producing (<= 1 s)", i["longest_pause_s"] <= 1.0)
    return rows


def _level_tables(runs, levels) -> list[str]:
    lines = ["## Aggregate tokens/s by concurrency", "",
             "Median of the repeated cold runs at each level; the range of all runs in brackets.", "",
             "| system | " + " | ".join(f"N={n}" for n in levels) + " |", "|---|" + "---|" * len(levels)]
    for key, run in runs.items():
        cells = []
        for n in levels:
            lv = _lv(run, n)
            spread = lv and lv.get("agg_tps_runs") or []
            cells.append("–" if not lv else f"{lv['agg_tps']:.1f}" + (
                f" [{min(spread):.0f}–{max(spread):.0f}]" if len(spread) > 1 else ""))
        lines.append(f"| {NAMES.get(key, key)} | " + " | ".join(cells) + " |")
    lines += ["", "## Latency", "", "| system | N | TTFT p50 (s) | TTFT p95 (s) | per-stream tok/s |", "|---|---|---|---|---|"]
    for key, run in runs.items():
        for n in levels:
            if lv := _lv(run, n):
                lines.append(f"| {NAMES.get(key, key)} | {n} | {lv['ttft_p50']:.2f} | {lv['ttft_p95']:.2f} | "
                             f"{lv['stream_tps']:.1f} |")
    return lines


def _long_prompt_table(runs) -> list[str]:
    rows = [(k, r) for k, r in runs.items() if r.get("interference")]
    if not rows:
        return []
    lines = ["", "## Prefix reuse and long prompts", "",
             "| system | shared-prefix TTFT cold / warm (s) | turn 1 / turn 5 TTFT (s) | long prompt: tokens, "
             "prefill (s) | running stream tok/s before / during | longest pause (s) |", "|---|---|---|---|---|---|"]
    for key, r in rows:
        p, t, i = r["prefix"], r["turns"]["ttft_by_turn"], r["interference"]
        lines.append(f"| {NAMES.get(key, key)} | {p['cold_ttft']:.2f} / {p['warm_ttft']:.2f} | {t[0]:.2f} / {t[-1]:.2f} "
                     f"| {i['prompt_tokens']}, {i['prefill_s']:.0f} | {i['before_tps']:.1f} / {i['during_tps']:.1f} "
                     f"| {i['longest_pause_s']:.2f} |")
    return lines


def _where_time_goes(data) -> list[str]:
    steps = data.get("steps")
    if not steps:
        return []
    lines = ["", "## Where the time goes", "",
             "Measured in-process on the same model: a decode step of the bare model, the same step's matmuls "
             "alone (every weight, LM head included, on the real weights) and the engine's step.", "",
             "| batch | forward-only ms/step | matmuls alone ms | rest of the forward ms | engine tok/s | "
             "engine / forward |", "|---|---|---|---|---|---|"]
    for b, s in sorted(steps["decode"].items(), key=lambda kv: int(kv[0])):
        fwd_tps = int(b) / s["forward_s"]
        lines.append(f"| {b} | {s['forward_s'] * 1e3:.0f} | {s['matmul_s'] * 1e3:.0f} | "
                     f"{(s['forward_s'] - s['matmul_s']) * 1e3:.0f} | {s['engine_tps']:.1f} | "
                     f"{s['engine_tps'] / fwd_tps:.0%} |")
    p = steps["prefill"]
    lines += ["", f"Prefill: a {p['chunk']}-token chunk takes {p['at_0_s']:.2f} s at the start of a prompt and "
              f"{p['at_4096_s']:.2f} s 4,096 tokens in: attention over the context read so far is "
              f"{1 - p['at_0_s'] / p['at_4096_s']:.0%} of the later chunk."]
    if data.get("kernel_ops"):
        from kernel_ops import markdown

        lines += ["", "## Our kernels against the MLX ops they replace", "",
                  "One op at a time on the default model's shapes, each call evaluated alone (best of 20; ms).", ""]
        lines += markdown(data["kernel_ops"])
    if data.get("notes"):
        lines += ["", data["notes"]]
    return lines


def _kernels_line(k: dict) -> str:
    if k.get("path") != "native":
        return f"not in use ({k.get('reason')})"
    return f"native, {k['isa']} ({', '.join(k['isa_supported'])} supported), {k['threads']} threads"


def _prompt_table(runs) -> list[str]:
    rows = [(k, r["prompt_read"]) for k, r in runs.items() if r.get("prompt_read")]
    if not rows:
        return []
    lines = ["", "## Reading a long prompt alone", "",
             "One request, one new token; median of three cold runs (a salt first, so no prefix cache serves it).", "",
             "| system | prompt tokens | seconds | prompt tokens/s |", "|---|---|---|---|"]
    lines += [f"| {NAMES.get(k, k)} | {p['prompt_tokens']} | {p['seconds']:.2f} | {p['prompt_tps']:.0f} |" for k, p in rows]
    return lines


def _real_lv(model, key, n):
    run = model["runs"][key]["levels"]
    return run.get(n) or run.get(str(n))


def real_targets(data) -> list[tuple[str, str, str, bool]]:
    """Per real-size file: the targets against llama-server on the same file."""
    from real_sizes import bandwidth

    real = data.get("real") or {}
    rows = []
    for name, model in (real.get("models") or {}).items():
        for n, goal in ((1, 1.0), (8, 1.3), (32, 1.3)):
            a, b = _real_lv(model, "ours", n), _real_lv(model, "llama_server", n)
            if a and b:
                r = a["agg_tps"] / b["agg_tps"]
                rows.append((f"{name}: {n} stream{'s' * (n > 1)} vs llama-server", f"{r:.2f}x", f">= {goal}x", r >= goal))
        a, b = model["runs"]["ours"].get("prompt_read"), model["runs"]["llama_server"].get("prompt_read")
        if a and b:
            r = a["prompt_tps"] / b["prompt_tps"]
            rows.append((f"{name}: {a['prompt_tokens']}-token prompt read alone",
                         f"{a['prompt_tps']:.0f} / {b['prompt_tps']:.0f} tok/s = {r:.2f}x", ">= 1.0x", r >= 1.0))
        mo, ml = model["peak_rss"]["ours"], model["peak_rss"]["llama_server"]
        rows.append((f"{name}: peak resident memory (ours / llama-server)", f"{mo / 1e6:.0f} / {ml / 1e6:.0f} MB",
                     "<= +15%", mo <= 1.15 * ml))
        if real.get("read_bandwidth_gbs"):
            ours, cpp = bandwidth(model, "ours"), bandwidth(model, "llama_server")
            frac = ours / real["read_bandwidth_gbs"]
            rows.append((f"{name}: weights read at one stream (ours / llama-server / machine)",
                         f"{ours:.1f} / {cpp:.1f} / {real['read_bandwidth_gbs']:.1f} GB/s = {frac:.0%}", ">= 90%",
                         frac >= 0.9))
    return rows


def _real_tables(data) -> list[str]:
    real = data.get("real") or {}
    models = real.get("models") or {}
    if not models:
        return []
    lines = ["", "## The models people bring (GGUF, Q4_K_M, beside llama-server on the same file)", "",
             f"{real.get('date', data['date'])}. Random weights written in each model's real layout and vocabulary size, "
             "quantized by llama.cpp's llama-quantize (bench/real_models.py); aggregate tokens/s, median of cold runs; "
             "peak resident memory of each server process over the whole run.", "",
             "| model file | system | N=1 | N=8 | N=32 | 2k prompt read | weights read at N=1 | peak RSS |",
             "|---|---|---|---|---|---|---|---|"]
    from real_sizes import bandwidth

    for name, model in models.items():
        for key in ("ours", "llama_server"):
            run = model["runs"][key]
            cells = [f"{_real_lv(model, key, n)['agg_tps']:.1f}" if _real_lv(model, key, n) else "-" for n in (1, 8, 32)]
            pr = run.get("prompt_read")
            lines.append(f"| {model['file']} | {NAMES[key]} | {' | '.join(cells)} | "
                         f"{pr['prompt_tps']:.0f} tok/s | {bandwidth(model, key):.1f} GB/s | "
                         f"{model['peak_rss'][key] / 1e6:.0f} MB |" if pr else "")
    if real.get("read_bandwidth_gbs"):
        lines += ["", f"This machine reads {real['read_bandwidth_gbs']:.1f} GB/s with every core streaming "
                  "(bench/bandwidth.c)."]
    return lines


def write_report(data, out: Path, readme: Path | None = None) -> None:
    runs = data["runs"]
    levels = sorted({int(n) for r in runs.values() for n in r["levels"]})
    m = data["machine"]
    head = (f"{data['date']}, {data['platform']}, {data['cpus']} CPUs. Model smollm2-135m-instruct, greedy, "
            f"{data['max_tokens']} new tokens per request, streaming through the openai SDK, every run on prompts "
            f"no server has seen. BLAS: {m['runtime']['blas']}.")
    absent = [NAMES[k] for k in NAMES if k not in runs]
    lines = ["# Benchmark results", "", head, "",
             "Only ratios within this run are meaningful; absolute numbers vary between runs and machines."]
    if absent:
        lines += ["", "Not measured (not installed or skipped): " + ", ".join(absent) + "."]
    lines += [""] + _level_tables(runs, levels) + _prompt_table(runs) + _long_prompt_table(runs) + _real_tables(data)
    lines += ["", "## Targets", "", "| measure | value | target | met |", "|---|---|---|---|"]
    lines += [f"| {label} | {value} | {goal} | {'yes' if ok else 'NO'} |"
              for label, value, goal, ok in targets(data) + real_targets(data)]
    lines += ["", "## Machine limits", "",
              f"- copy bandwidth {m['copy_gbs']:.1f} GB/s; sgemm {m['sgemm_gflops']:.1f} GFLOP/s (512x576x1536, fp32)",
              f"- model: {m['matmul_params'] / 1e6:.0f} M matmul weights, {m['bytes_per_token'] / 1e6:.0f} MB read and "
              f"{m['flops_per_token'] / 1e9:.2f} GFLOP per token ({m.get('dtype', 'float32')} weights)",
              f"- kernels: {_kernels_line(m['runtime'].get('kernels') or {})}"]
    lines += _where_time_goes(data)
    _write_atomically(out / "latest.md", "\n".join(lines) + "\n")
    _plot(data, levels, out / "throughput.png")
    if readme is not None:
        summary = [head, ""] + _level_tables(runs, levels)[4:len(runs) + 6] + _real_tables(data) + [
                   "", "Targets, latency and where the time goes: [bench/results/latest.md](../bench/results/latest.md)."]
        update_readme(readme, "\n".join(summary))


def update_readme(readme: Path, table: str) -> None:
    """Replace what stands between the page's bench markers (docs/benchmarks.md) with `table`."""
    text = readme.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    _write_atomically(readme, text[:start] + "\n" + table + "\n" + text[end:])


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _plot(data, levels, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, run in data["runs"].items():
        xs = [n for n in levels if _lv(run, n)]
        ax.plot(xs, [_agg(run, n) for n in xs], marker="o", label=NAMES.get(key, key))
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(n) for n in levels])
    ax.set_xlabel("concurrent streaming requests")
    ax.set_ylabel("aggregate tokens/s (median of cold runs)")
    ax.set_title("smollm2-135m-instruct, 2-core CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
