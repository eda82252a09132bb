"""One real `jupyter mlx` server on tiny-llama for the notebook tests that go through HTTP
(Client contract, magics connected to a server, widgets fed by the events route)."""

import pytest


@pytest.fixture(scope="session")
def live(tmp_path_factory):
    from live_server import serving

    with serving(tmp_path_factory.mktemp("live"), "tiny-llama") as server:
        yield server
