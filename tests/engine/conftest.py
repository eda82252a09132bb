import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for reference.py


@pytest.fixture(scope="module")
def llama_engine():
    from mlx_nb import Engine

    with Engine("tiny-llama", max_batch=16, wait=True) as engine:
        yield engine
