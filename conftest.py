"""The suite runs on two workers (`make test`: pytest-xdist, `--dist loadgroup`). A file's tests stay
together in one worker: its module fixtures (servers, loaded models) are built once, and a tutorial
notebook's cells run in order in one kernel. A test that names its own group (a shard of a long
sweep) goes to whichever worker is free."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
