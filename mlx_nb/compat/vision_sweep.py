"""The vision rows of the compatibility matrix: every mlx_vlm family with a tiny fixture, checked.

    python -m mlx_nb.compat.vision_sweep            # all families -> mlx_nb/compat/mlx_vlm.json
    python -m mlx_nb.compat.vision_sweep tiny-llava # some families, printed only

Each family is checked by `vision_check.check_family` (mlx_vlm's own generate per request alone
vs the engine serving them together) and gets a verdict: batched, refused (the engine would
differ from mlx_vlm, or fails: the loader refuses the family with this reason), or untestable
(mlx_vlm itself cannot run it here, or the fixture cannot tell right from wrong). The file is
what the loader reads to refuse a family, and what docs/compatibility.md renders.
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


def sweep(names: list[str], prefill_step_size: int = 16) -> list[dict]:
    from mlx_nb.compat.vision_check import check_family

    entries = []
    for name in names:
        report = check_family(name, prefill_step_size=prefill_step_size)
        entries.append(report.entry())
        print(f"{report.architecture:>14}  {report.verdict:<10} {report.reason}", flush=True)
    return entries


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
