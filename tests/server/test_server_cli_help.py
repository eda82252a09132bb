"""`jupyter mlx --help` (and --help-all) print the options, among them the model and the services."""

import shutil
import subprocess
import sys
from pathlib import Path


def test_jupyter_mlx_help_lists_its_options():
    exe = shutil.which("jupyter-mlx", path=str(Path(sys.executable).parent))
    assert exe, "the jupyter-mlx console script is not installed"
    for flag in ("--help", "--help-all"):
        out = subprocess.run([exe, flag], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "--model" in out.stdout and "--services" in out.stdout and "ModelServerApp.jupyter_services" in out.stdout
