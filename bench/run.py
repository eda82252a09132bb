"""The benchmark: this project against mlx_lm.server (and optional peers), measured in one run.

    .venv/bin/python bench/run.py    # writes bench/results/latest.md, throughput.png and docs/benchmarks.md's table

Every number that matters is a ratio between systems measured minutes apart on the same machine:
absolute numbers are not comparable across runs or machines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402  (preloads the fast BLAS before MLX)

import kernel_ops  # noqa: E402
import limits  # noqa: E402
import prefix  # noqa: E402
import real_sizes  # noqa: E402
import servers  # noqa: E402
import steps  # noqa: E402
import workload  # noqa: E402

RESULTS = HERE / "results"
MODEL = "smollm2-135m-instruct"


def export_dense(loaded, dtype: str, dest: Path) -> Path:
    """The default model as a plain dense MLX directory (what mlx_lm.server is given)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import save_config, save_model

    if (dest / "config.json").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = loaded.model
    cast = getattr(mx, dtype)
    model.update(tree_map(lambda a: a.astype(cast) if mx.issubdtype(a.dtype, mx.floating) else a, model.parameters()))
    save_model(tmp, model)
    config = {k: v for k, v in loaded.config.items() if k not in ("quantization", "quantization_config")}
    save_config(config, tmp / "config.json")
    for f in loaded.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(f, tmp / f.name)
    tmp.rename(dest)
    return dest


def measure(server, levels, max_tokens, reps, extras=None) -> dict:
    return measure_side_by_side([server], levels, max_tokens, reps, extras)[0]


def measure_side_by_side(servers, levels, max_tokens, reps, extras=None, prompt_text=None) -> list[dict]:
    """Each level (and the long-prompt read) with the servers' runs taking turns; `extras` for the first."""
    outs = [{"name": s.name, "levels": {}} for s in servers]
    for s in servers:
        workload.concurrent(s, 1, 8, salt="warm")  # load, JIT kernels
    for n in levels:
        for s, out, lv in zip(servers, outs, workload.paired_level(servers, n, max_tokens, reps)):
            out["levels"][n] = lv
            print(f"  {s.name} N={n}: {lv['agg_tps']:.1f} tok/s", flush=True)
    if prompt_text:
        for s, out, p in zip(servers, outs, workload.prompt_read(servers, prompt_text)):
            out["prompt_read"] = p
            print(f"  {s.name} prompt: {p['prompt_tps']:.0f} tok/s", flush=True)
    if extras:
        server, out = servers[0], outs[0]
        out["prefix"] = prefix.shared_prefix_ttft(server, extras["system_text"])
        out["turns"] = prefix.turn_costs(server)
        out["interference"] = prefix.long_prompt_interference(server, extras["long_text"], extras["eos_ids"])
        print(f"  {server.name} long prompt: {out['interference']}", flush=True)
    return outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3, help="cold runs per level (the median is reported)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: plain,runtime,llamacpp,real")
    ap.add_argument("--real-only", action="store_true",
                    help="measure only the real-size GGUFs beside llama-server, into the last run's results")
    ap.add_argument("--real-models", default="", help="comma-separated real-size models (default: all)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite latest.md, the plot and docs/benchmarks.md's table from latest.json (after editing findings.md)")
    args = ap.parse_args()
    if args.report_only:
        return write(json.loads((RESULTS / "latest.json").read_text()))
    if args.real_only:
        data = json.loads((RESULTS / "latest.json").read_text())
        names = [n for n in args.real_models.split(",") if n] or None
        fresh = real_sizes.run_all(_prompt_text(), args.max_tokens, args.reps, _logs(), names)
        kept = (data.get("real") or {}).get("models", {}) if names else {}
        data["real"] = {**fresh, "models": {**kept, **fresh.get("models", {})}, "date": _stamp()}
        (RESULTS / "latest.json").write_text(json.dumps(data, indent=2, default=str))
        return write(data)
    levels = [int(x) for x in args.levels.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    logs = _logs()

    from mlx_nb.models import load_model
    from mlx_nb.models.sources import _smollm2_gguf, models_dir

    loaded = load_model(MODEL)
    tok = loaded.tokenizer
    extras = {"system_text": prefix.text_of(tok, 1500), "long_text": prefix.text_of(tok, 8000),
              "eos_ids": sorted(tok.eos_token_ids)}
    prompt_text = _prompt_text(tok)
    machine = {
        "copy_gbs": limits.copy_bandwidth_gbs(),
        "sgemm_gflops": limits.sgemm_gflops(),
        **limits.model_costs(loaded),
        "runtime": mlx_nb.runtime_info(),
    }
    print("kernel ops", flush=True)
    ops = kernel_ops.table(loaded) if loaded.dtype == "kernels" else []
    os.environ["MLX_NB_DTYPE"] = "float32"  # the dense exports for mlx_lm.server
    f32_dir = export_dense(load_model(MODEL), "float32", models_dir() / f"{MODEL}-float32")
    f16_dir = export_dense(load_model(MODEL), "float16", models_dir() / f"{MODEL}-float16")
    del os.environ["MLX_NB_DTYPE"]
    del loaded
    print("where the time goes", flush=True)
    step_profile = steps.profile(MODEL)

    runs = {}
    llama = "llamacpp" not in skip and servers.llama_server_binary() is not None
    print("mlx-nb" + (" and llama-server, side by side" if llama else ""), flush=True)
    with contextlib.ExitStack() as stack:
        # Both up at once (each idles while the other runs): their runs take turns at every level,
        # so a machine slowing down for a few minutes slows both sides of each ratio.
        up = [stack.enter_context(servers.mlx_nb_server(MODEL, log=logs / "mlx-nb.log"))]
        if llama:
            up.append(stack.enter_context(servers.llama_server(_smollm2_gguf(), log=logs / "llama_server.log")))
        measured = measure_side_by_side(up, levels, args.max_tokens, args.reps, extras, prompt_text)
        runs["ours"] = measured[0]
        if llama:
            runs["llama_server"] = measured[1]
    if "plain" not in skip:
        print("mlx_lm.server", flush=True)
        with servers.mlx_lm_server(f16_dir, fast_runtime=False, log=logs / "mlx_lm.log") as s:
            # one run per level and no long-prompt extras: on the reference BLAS an 8k prefill takes half an hour
            runs["peer"] = measure(s, levels, args.max_tokens, 1)
    if "runtime" not in skip:
        print("mlx_lm.server + runtime", flush=True)
        with servers.mlx_lm_server(f32_dir, fast_runtime=True, log=logs / "mlx_lm_runtime.log") as s:
            runs["peer_runtime"] = measure(s, levels, args.max_tokens, args.reps, extras)

    if "real" not in skip:
        print("real-size GGUFs beside llama-server", flush=True)
        real = real_sizes.run_all(prompt_text, args.max_tokens, args.reps, logs)
    stamp = _stamp()
    data = {"date": stamp, "machine": machine, "platform": platform.platform(), "cpus": os.cpu_count(),
            "max_tokens": args.max_tokens, "reps": args.reps, "runs": runs, "steps": step_profile, "kernel_ops": ops}
    if "real" not in skip:
        data["real"] = {**real, "date": stamp}
    (RESULTS / "latest.json").write_text(json.dumps(data, indent=2, default=str))
    write(data)


def _stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _logs() -> Path:
    logs = RESULTS / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def _prompt_text(tok=None) -> str:
    """About 2,000 tokens of ordinary prose (the quality text), for reading a long prompt alone."""
    if tok is None:
        from mlx_nb.models import load_model

        tok = load_model(MODEL).tokenizer
    words = (HERE / "data" / "quality_text.txt").read_text().split()
    return " ".join(words[: int(len(words) * 1900 / len(tok.encode(" ".join(words))))])


def write(data: dict) -> None:
    """The report, with bench/findings.md (what was learnt from the numbers) as its last section."""
    from report import write_report

    findings = HERE / "findings.md"
    data["notes"] = findings.read_text().strip() if findings.exists() else ""
    write_report(data, RESULTS, readme=HERE.parent / "docs" / "benchmarks.md")
    print((RESULTS / "latest.md").read_text())


if __name__ == "__main__":
    main()
