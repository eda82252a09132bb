"""The compatibility matrix: per architecture, whether batched output equals one-at-a-time output.

Measured by the sweep (`make compat`, `mlx_nb/compat/sweep.py`) and shipped as data, one JSON file
per package in this folder (`mlx_lm.json`, `mlx_vlm.json`); the engine decides each model's
batching policy from it (`mlx_nb/engine/batch/batchability.py`) and `docs.py` renders
docs/compatibility.md from every file here. Schema of a file:

    {
      "package": "mlx_lm",                       # the package whose architectures are listed
      "versions": {"mlx": "0.32.4", "mlx_lm": "0.32.2", "mlx_vlm": "0.7.10"},  # as measured
      "date": "2025-01-31",                       # when the sweep ran (UTC)
      "entries": [ENTRY, ...]                     # one per architecture, sorted by name
    }

    ENTRY = {
      "architecture": "mamba",                    # mlx_lm: the module name in mlx_lm/models
                                                  # mlx_vlm: the model_type of the family
      "package": "mlx_lm",
      "cache_types": ["ArraysCache", ...],        # per layer of the tiny instance; a CacheList
                                                  # is a list of its members' names
      "verdict": "batched",                       # one of VERDICTS
      "reason": "one line: why this verdict",
      "checks": {"reference": true, ...}          # CHECKS -> true (passed), false (failed),
                                                  # null (not run or not applicable)
      "details": {...}                            # optional, free-form (rows that differ, errors)
    }

Verdicts:
- `batched`: prompts prefilled together (right-padded) and decoded together give exactly the
  tokens the reference gives for each prompt alone.
- `prefill_alone`: correct only when each prompt is prefilled on its own; decode still batches.
- `sequential`: wrong even with prompts prefilled alone, or the batched run fails, or its caches
  cannot merge; served one request at a time through generate_step, which equals the reference.
- `refused`: the model runs alone but not even the sequential lane gives the reference's tokens.
- `untested`: no tiny instance could be built or run alone here (the reason says why); the
  engine treats it like an architecture the matrix has never seen.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

VERDICTS = ("batched", "prefill_alone", "sequential", "refused", "untested")
CHECKS = (
    "build",          # a tiny instance was built and loaded through mlx_nb's loader
    "reference",      # every prompt ran alone through the independent reference
    "batched",        # the prompts together (prefilled together) == reference, row for row
    "late_join",      # requests submitted while others decoded joined the batch and match
    "abort",          # a request aborted mid-decode ended so; the others finished (their tokens: "batched")
    "prefix",         # a turn reusing the previous turn's cache (warm) == reference (cold)
    "prefill_alone",  # with prompts prefilled one at a time, every row == reference
    "sequential",     # one request at a time (queued, abortable), every row == reference
)
HERE = Path(__file__).parent


def folder() -> Path:
    """Where the matrix files are read from: MLX_NB_COMPAT_DIR if set, else this package folder."""
    return Path(os.environ.get("MLX_NB_COMPAT_DIR") or HERE)


def read(package: str, where: Optional[Path] = None) -> Optional[dict]:
    """The whole file for `package`, or None when there is none."""
    path = (where or folder()) / f"{package}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def entries(package: str, where: Optional[Path] = None) -> dict[str, dict]:
    """architecture -> entry, for `package` ({} when no file)."""
    return index(read(package, where) or {})


def index(data: dict) -> dict[str, dict]:
    """architecture -> entry, for one file's data."""
    return {e["architecture"]: e for e in data.get("entries", [])}


def write(package: str, data: dict, where: Optional[Path] = None) -> Path:
    """Write the file atomically (a reader never sees half of it)."""
    path = (where or folder()) / f"{package}.json"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def verdict_of(checks: dict) -> str:
    """The verdict the checks imply: the one rule both the sweep and the tests apply."""
    if not checks.get("build") or not checks.get("reference"):
        return "untested"
    together = ("batched", "late_join", "abort")
    if all(checks.get(c) for c in together) and checks.get("prefix") is not False:
        return "batched"
    if checks.get("prefill_alone"):
        return "prefill_alone"
    if checks.get("sequential"):
        return "sequential"
    return "refused"


def leaf_types(cache_types: list) -> set[str]:
    """Every cache class name in a per-layer list, CacheList members included."""
    out: set[str] = set()
    for t in cache_types:
        if isinstance(t, list):
            out |= leaf_types(t)
        else:
            out.add(t)
    return out
