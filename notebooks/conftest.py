"""Tutorial notebooks run under nbval, which ignores display updates: ask the magics for one final
display instead of a live stream while a notebook's kernel starts and runs."""

import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.fspath.ext == ".ipynb":
        os.environ["MLX_NB_NO_STREAM"] = "1"


def pytest_runtest_teardown(item):
    if item.fspath.ext == ".ipynb":
        os.environ.pop("MLX_NB_NO_STREAM", None)
