"""The Lab extension's own unit tests (labextension/tests, jest in a jsdom DOM), run by the suite:
what the browser tests do not reach (every engine state the status bar names, the SVG cleaning
against hostile pictures). `make test` installed the toolchain (`npm ci` in labextension/)."""

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "labextension"


def test_jest_unit_tests_pass():
    if shutil.which("npm") is None:
        pytest.skip("NOT RUN: npm is not installed (node 18+ builds and tests the Lab extension)")
    assert (HERE / "node_modules" / ".bin" / "jest").exists(), "run make test: it installs the extension's toolchain"
    done = subprocess.run(["npm", "test", "--silent"], cwd=HERE, capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "Tests:" in report and "failed" not in report.split("Tests:")[1].splitlines()[0], report[-2000:]
