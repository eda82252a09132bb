"""In-process Jupyter servers (pytest-jupyter) with the mlx extension on a tiny model.

pytest-jupyter's fixtures are imported rather than named in `pytest_plugins`: pytest refuses
`pytest_plugins` in a conftest below the rootdir when the whole suite runs (`pytest tests`), and
importing them scopes them (and their autouse cleanup) to this folder, which is what we want.
"""

import threading

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403  (fixtures and the async-test hooks)
from server_helpers import server_config


@pytest.fixture
def jp_server_config():
    return server_config()


@pytest.fixture
def mlx_ext(jp_serverapp):
    """The extension app of the running test server (its engine may still be loading)."""
    return jp_serverapp.extension_manager.extension_points["mlx"].app


@pytest.fixture
def mlx_ready(mlx_ext):
    mlx_ext.engine.wait_ready(60)
    return mlx_ext


@pytest.fixture
def load_gate(monkeypatch):
    """Holds every model load until `.set()`: a deterministic "still loading" window."""
    import mlx_nb.models

    gate = threading.Event()
    real = mlx_nb.models.load_model

    def gated(*args, **kwargs):
        gate.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(mlx_nb.models, "load_model", gated)
    yield gate
    gate.set()  # never leave an engine thread blocked
