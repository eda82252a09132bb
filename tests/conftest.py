"""Shared test set-up: import mlx_nb first so the fast BLAS (if any) is preloaded before MLX."""

import os
import sys
from pathlib import Path

import mlx_nb  # noqa: F401  (must precede any mlx import)
import pytest

# Servers the tests start keep their prefix cache in memory only (their default folder is shared by
# every server of the same weights: one test's entries would be another's hits); tests of the disk
# cache name their own folder.
os.environ["MLX_NB_PREFIX_CACHE_DIR"] = ""

sys.path.insert(0, str(Path(__file__).parent))  # helpers shared by the test folders (forcing.py)

TINY_TEXT = ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3", "tiny-falcon-h1"]


@pytest.fixture(scope="session")
def tiny_text_names():
    return list(TINY_TEXT)
