"""Tutorial notebooks run under nbval, which ignores display updates: ask the magics for one final
display instead of a live stream while a notebook's kernel starts and runs. Each notebook's jobs and
fine-tunes are kept in a folder of its own (MLX_NB_JOBS_DIR), made when its first cell starts the
kernel and removed when the run ends, so a map runs each time instead of finding an earlier run's."""

import atexit
import os
import shutil
import tempfile

import pytest

_JOBS_DIRS: dict = {}  # notebook path -> its jobs folder, for this run


def _jobs_dir(path: str) -> str:
    if path not in _JOBS_DIRS:
        _JOBS_DIRS[path] = tempfile.mkdtemp(prefix="mlx-nb-tutorial-jobs-")
        atexit.register(shutil.rmtree, _JOBS_DIRS[path], True)
    return _JOBS_DIRS[path]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.fspath.ext == ".ipynb":
        os.environ["MLX_NB_NO_STREAM"] = "1"
        os.environ["MLX_NB_JOBS_DIR"] = _jobs_dir(str(item.fspath))


def pytest_runtest_teardown(item):
    if item.fspath.ext == ".ipynb":
        os.environ.pop("MLX_NB_NO_STREAM", None)
        os.environ.pop("MLX_NB_JOBS_DIR", None)
