"""Build the tutorial notebooks from their sources and execute them, so saved outputs are real.

    .venv/bin/python scripts/build_notebooks.py            # all of notebooks/sources/*.py
    .venv/bin/python scripts/build_notebooks.py 03         # those whose name contains "03"

Sources are jupytext percent-format scripts (reviewable diffs); the executed .ipynb files next to
them are what nbval checks in the test command. MLX_NB_NO_STREAM=1 makes %%mlx chat emit one final
display, because nbval ignores display updates.

Widget state is not stored, as JupyterLab saves notebooks by default: a widget's output then keeps
its static picture (text/html beside the widget view), which is what GitHub, nbviewer, an HTML
export and an untrusted notebook show.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent / "notebooks"


def build(src: Path) -> Path:
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    os.environ["MLX_NB_NO_STREAM"] = "1"
    # jobs and fine-tunes in a folder of this build's own, as under nbval: a tutorial must neither find
    # an earlier run's nor leave its own in the user's data home
    jobs = os.environ["MLX_NB_JOBS_DIR"] = tempfile.mkdtemp(prefix="mlx-nb-tutorial-jobs-")
    t = time.time()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=False,
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    out = ROOT / f"{src.stem}.ipynb"
    nbformat.write(nb, out)
    print(f"{out.name}: {time.time() - t:.0f} s")
    return out


if __name__ == "__main__":
    picks = sys.argv[1:]
    for src in sorted((ROOT / "sources").glob("*.py")):
        if not picks or any(p in src.stem for p in picks):
            build(src)
