"""Tutorial notebooks run under nbval, which ignores display updates: ask the magics for one final
display instead of a live stream while a notebook's kernel starts and runs. Their jobs are kept in a
folder of the run's own (MLX_NB_JOBS_DIR), so a map runs each time instead of finding an earlier run's."""

import os
import tempfile

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.fspath.ext == ".ipynb":
        os.environ["MLX_NB_NO_STREAM"] = "1"
        os.environ.setdefault("MLX_NB_JOBS_DIR", tempfile.mkdtemp(prefix="mlx-nb-tutorial-jobs-"))


def pytest_runtest_teardown(item):
    if item.fspath.ext == ".ipynb":
        os.environ.pop("MLX_NB_NO_STREAM", None)
        os.environ.pop("MLX_NB_JOBS_DIR", None)
