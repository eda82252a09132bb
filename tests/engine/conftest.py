import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for reference.py


@pytest.fixture(scope="module")
def llama_engine():
    from mlx_nb import Engine

    with Engine("tiny-llama", max_batch=16, wait=True) as engine:
        yield engine


def forcing(token_ids: list[int]):
    """A logits processor that makes the model emit exactly `token_ids`, one per step."""
    import mlx.core as mx

    state = {"i": 0}

    def processor(tokens, logits):
        target = token_ids[min(state["i"], len(token_ids) - 1)]
        state["i"] += 1
        mask = mx.arange(logits.shape[-1]) == target  # logits are one row: (1, vocab)
        return mx.where(mask[None], 0.0, -1e9).astype(logits.dtype)

    return processor
