"""`python -m mlx_nb.compat.sweep`: measure every mlx_lm architecture into mlx_nb/compat/mlx_lm.json.

Each architecture is measured on several tiny random instances (`configs.INSTANCES`: seeds and
config variants), each in its own subprocess with a time limit: the instance is built from its
generated config (`configs.py`), then `checks.measure` runs it alone and batched, and the entry
combines the instances (`checks.combine`: batched only if every instance is). Some upstream models
crash the interpreter on CPU or hang; the child records its stage before each step, so a crash or
a timeout is classified for that instance and the sweep goes on. A crash or hang in the batched
run is retried with prompts prefilled one at a time, and one there with the sequential lane.

    python -m mlx_nb.compat.sweep                 # all, in the installed mlx_lm
    python -m mlx_nb.compat.sweep --only mamba,llama   # re-measure some; keep the other entries
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from mlx_nb.compat import matrix

PACKAGE = "mlx_lm"


# -- the child: one instance of one architecture --------------------------------------------------
def measure_one(arch: str, instance: str, state: Path, skip: dict) -> None:
    from mlx_nb.compat import checks
    from mlx_nb.compat.configs import INSTANCES, NotTinyError, write_tiny
    from mlx_nb.engine import first_line

    def note(stage: str, entry: dict) -> None:
        state.write_text(json.dumps({"stage": stage, "entry": entry}))

    seed, variant = INSTANCES[instance]
    entry = {"cache_types": [], "checks": {"build": False}, "details": {}}
    with tempfile.TemporaryDirectory() as tmp:
        note("build", entry)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                out = write_tiny(arch, Path(tmp) / arch, seed, variant)
        except BaseException as exc:  # SystemExit included: a module may exit on import
            said = printed.getvalue().strip().splitlines()
            why = said[-1] if isinstance(exc, SystemExit) and said else first_line(exc)
            kind = "" if isinstance(exc, NotTinyError) else f"{type(exc).__name__}: "
            entry["details"]["error"] = f"build: {kind}{why}"
            note("done", checks.finish(entry))
            return
        entry = checks.measure(str(out), note, **skip)
    note("done", entry)


# -- the parent: every architecture, each instance in a subprocess --------------------------------
def run_child(arch: str, instance: str, timeout: float, skip: Optional[dict] = None) -> tuple[dict, Optional[str]]:
    """(state the child left, how it ended if not cleanly: 'timed out after N s' / 'crashed (SIGSEGV)')."""
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as f:
        state = Path(f.name)
    cmd = [sys.executable, "-m", "mlx_nb.compat.sweep", "--one", arch, "--instance", instance,
           "--state", str(state), "--skip", json.dumps(skip or {})]
    ended = None
    try:
        proc = subprocess.run(cmd, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            ended = f"crashed ({_signal_name(proc.returncode)})"
    except subprocess.TimeoutExpired:
        ended = f"timed out after {timeout:.0f} s"
    try:
        found = json.loads(state.read_text() or "{}")
    except json.JSONDecodeError:
        found = {}
    state.unlink(missing_ok=True)
    return found, ended


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return f"exit status {code}"


# A crash or hang in one engine run is retried without it: the batched run, then prompts
# prefilled one at a time, then the sequential lane.
RETRY = {"batched": "batched_failed", "prefill_alone": "alone_failed"}


def sweep_instance(arch: str, instance: str, timeout: float) -> dict:
    from mlx_nb.compat import checks

    skip: dict = {}
    while True:
        found, ended = run_child(arch, instance, timeout, skip)
        stage = found.get("stage")
        if stage == "done" and ended is None:
            return found["entry"]
        entry = found.get("entry") or {"cache_types": [], "checks": {"build": False}, "details": {}}
        if stage in RETRY and RETRY[stage] not in skip:
            skip[RETRY[stage]] = f"the {stage.replace('_', ' ')} run {ended}"
            continue
        break
    entry["details"].setdefault("error", f"{stage}: the process {ended}")
    if stage in ("prefill_alone", "sequential"):
        entry["checks"][stage] = False
        entry["details"][stage] = {"error": f"the run {ended}"}
    return checks.finish(entry)


def sweep_one(arch: str, timeout: float) -> dict:
    """Every instance of `arch` (configs.INSTANCES), combined into one entry (checks.combine)."""
    from mlx_nb.compat import checks
    from mlx_nb.compat.configs import INSTANCES

    return checks.combine({name: sweep_instance(arch, name, timeout) for name in INSTANCES})


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("mlx", "mlx-lm", "mlx-vlm"):
        try:
            out[dist.replace("-", "_")] = version(dist)
        except PackageNotFoundError:
            out[dist.replace("-", "_")] = None
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated architectures; the other entries are kept")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per architecture run")
    p.add_argument("--out", type=Path, default=matrix.HERE, help="folder of the matrix files")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--instance", help=argparse.SUPPRESS)
    p.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--skip", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        import mlx_nb  # noqa: F401  (runtime set-up before MLX)

        measure_one(args.one, args.instance, args.state, json.loads(args.skip))
        return 0

    from mlx_nb.compat.configs import architectures

    every = architectures()
    wanted = args.only.split(",") if args.only else every
    unknown = sorted(set(wanted) - set(every))
    if unknown:
        p.error(f"not architectures of the installed mlx_lm: {unknown}")
    kept = {a: e for a, e in matrix.entries(PACKAGE, args.out).items() if a in every and a not in wanted}
    for i, arch in enumerate(wanted, 1):
        started = time.monotonic()
        entry = {"architecture": arch, "package": PACKAGE, **sweep_one(arch, args.timeout)}
        kept[arch] = entry
        print(f"[{i}/{len(wanted)}] {arch}: {entry['verdict']} ({time.monotonic() - started:.0f} s) "
              f"{entry['reason']}", flush=True)
        _save(kept, args.out)  # after each one: an interrupted sweep keeps what it measured
    return 0


def _save(entries: dict, where: Path) -> None:
    ordered = [entries[a] for a in sorted(entries)]
    data = {"package": PACKAGE, "versions": versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "entries": ordered}
    matrix.write(PACKAGE, data, where)


if __name__ == "__main__":
    sys.exit(main())
