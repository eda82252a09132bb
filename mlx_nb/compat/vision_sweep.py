"""The vision rows of the compatibility matrix: every mlx_vlm family with a tiny fixture, checked.

    python -m mlx_nb.compat.vision_sweep            # all families -> mlx_nb/compat/mlx_vlm.json
    python -m mlx_nb.compat.vision_sweep tiny-llava # some families, printed only

Each family is checked by `vision_check.check_family` (mlx_vlm's own generate per request alone
vs the engine serving them together) on INSTANCES weight draws, and gets the verdict every draw
allows (`checks.combine`): batched, sequential (served one request at a time, equal to mlx_vlm's
generate), refused (wrong even then: the loader refuses the family with this reason), or
untestable (mlx_vlm itself cannot run it here, or the fixture cannot tell right from wrong). The
file is what the loader reads, and what docs/compatibility.md renders.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from collections import Counter
from importlib.metadata import version

from mlx_nb.models.atomic import write_text_atomically
from mlx_nb.models.vision import COMPAT_FILE


INSTANCES = 3  # weight draws per family: the fixture's own seed, then the next ones (other requests too)


def sweep(names: list[str], prefill_step_size: int = 16) -> list[dict]:
    from mlx_nb.compat.checks import combine

    entries = []
    for name in names:
        entry = combine({label: check_instance(name, i, prefill_step_size) for i, label in enumerate(labels(name))})
        entries.append(entry)
        print(f"{entry['architecture']:>14}  {entry['verdict']:<10} {entry['reason']}", flush=True)
    return entries


def labels(name: str) -> list[str]:
    from mlx_nb.models.fixtures import _seed

    return [f"seed {_seed(name) + i}" for i in range(INSTANCES)]


def check_instance(name: str, i: int, prefill_step_size: int) -> dict:
    """Instance 0 is the fixture itself; the others are built with the next seeds, in a temporary
    folder, and asked other generated requests."""
    import tempfile
    from pathlib import Path

    from mlx_nb.compat.vision_check import check_family
    from mlx_nb.models.atomic import build_atomically
    from mlx_nb.models.fixtures import WEIGHT_SCALE, _seed
    from mlx_nb.models.fixtures_vision import build_vision

    if i == 0:
        return check_family(name, prefill_step_size=prefill_step_size).entry()
    with tempfile.TemporaryDirectory() as tmp:
        path = build_atomically(Path(tmp) / name, lambda out: build_vision(name, out, _seed(name) + i, WEIGHT_SCALE))
        return check_family(str(path), prefill_step_size=prefill_step_size, seed=i).entry()


def main(argv=None) -> int:
    from mlx_nb.models.fixtures_vision import VISION_CONFIGS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="fixture names (default: every vision fixture; then the file is written)")
    parser.add_argument("--prefill-step-size", type=int, default=16, help="vision prefill chunk (small: many chunks)")
    args = parser.parse_args(argv)
    os.environ["MLX_NB_VISION_COMPAT"] = ""  # the sweep decides the verdicts: it must not refuse by the old ones
    entries = sweep(args.names or sorted(VISION_CONFIGS), args.prefill_step_size)
    counts = Counter(e["verdict"] for e in entries)
    print(", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    if not args.names:
        document = {  # the schema of mlx_nb/compat/matrix.py, as the text sweep writes it
            "package": "mlx_vlm",
            "versions": {pkg: version(pkg) for pkg in ("mlx", "mlx_lm", "mlx_vlm")},
            "date": datetime.date.today().isoformat(),
            "entries": sorted(entries, key=lambda e: e["architecture"]),
        }
        write_text_atomically(COMPAT_FILE, json.dumps(document, indent=1) + "\n")
        print(f"wrote {COMPAT_FILE}")
    return 1 if counts.get("refused") and args.names else 0


if __name__ == "__main__":
    raise SystemExit(main())
