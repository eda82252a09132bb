import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # kernel_reference.py

from mlx_nb import kernels  # noqa: E402

if not kernels.available():  # the fallback path has its own tests (test_kernels_fallback.py)
    collect_ignore_glob = ["test_kernels_[!f]*.py"]


@pytest.fixture(params=kernels.info()["isa_supported"] or ["none"])
def isa(request):
    """Each instruction set this CPU runs, in turn (the best one restored after)."""
    native = kernels.native()
    best = native.isa_list().split(",")[0]
    assert native.set_isa(request.param)
    yield request.param
    native.set_isa(best)


@pytest.fixture(scope="session")
def native():
    return kernels.native()
