"""The wheel carries the Lab extension where JupyterLab finds it: built from this checkout (after
make built the extension), installed into a fresh prefix, `jupyter labextension list` shows the
extension enabled from that prefix's share/jupyter/labextensions."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAME = "mlx-nb-labextension"


def test_the_wheel_ships_the_lab_extension_enabled(tmp_path):
    if not (REPO / "jupyter_ext" / "labextension" / "package.json").exists():
        if shutil.which("node") is None:
            pytest.skip("NOT RUN: node/npm are not installed, so make did not build the Lab extension")
        pytest.fail("the Lab extension is not built: run make")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(REPO)], check=True)
    wheel = next((tmp_path / "dist").glob("mlx_nb-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = [n for n in names if f"/data/share/jupyter/labextensions/{NAME}/" in n]
    assert any(n.endswith(f"{NAME}/package.json") for n in shipped), names
    assert any("/static/remoteEntry." in n for n in shipped), shipped

    prefix = tmp_path / "prefix"
    # --ignore-installed: pip leaves the running environment's own (editable) install alone
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", "--prefix",
                    str(prefix), str(wheel)], check=True)
    data = prefix / "share" / "jupyter"
    env = {**os.environ, "JUPYTER_PATH": str(data)}
    listed = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True,
                            text=True, env=env)
    text = listed.stdout + listed.stderr
    section = text[text.index(str(data / "labextensions")):]  # the extensions found in that prefix
    line = next((x for x in section.splitlines()[1:3] if NAME in x), "")
    assert "enabled" in line and "OK" in line, text
    still = subprocess.run([sys.executable, "-c", "import mlx_nb; print(mlx_nb.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert still.stdout.strip() == str(REPO / "mlx_nb" / "__init__.py"), still  # the checkout is still what runs
