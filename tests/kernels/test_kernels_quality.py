"""The default model on the kernels reads the repo's fixed text within 2% of the perplexity its
float32 weights give (bench/quality.py measures the whole text and lists greedy replies)."""

import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlx_nb.models.loader import load_model

TEXT = Path(__file__).parents[2] / "bench" / "data" / "quality_text.txt"


def _perplexity(loaded, ids):
    window = mx.array(ids)[None]
    logits = loaded.model(window[:, :-1]).astype(mx.float32)
    return math.exp(nn.losses.cross_entropy(logits, window[:, 1:], reduction="mean").item())


def test_perplexity_within_2_percent_of_float32():
    kernels = load_model("smollm2-135m-instruct")
    assert kernels.dtype == "kernels"
    ids = kernels.tokenizer.encode(TEXT.read_text())[:513]  # bench/quality.py reads all of it
    assert len(ids) == 513
    ours = _perplexity(kernels, ids)
    del kernels
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLX_NB_DTYPE", "float32")
        reference = _perplexity(load_model("smollm2-135m-instruct"), ids)
    assert abs(ours / reference - 1) < 0.02, (ours, reference)
