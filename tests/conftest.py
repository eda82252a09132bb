"""Shared test set-up: import mlx_nb first so the fast BLAS (if any) is preloaded before MLX."""

import os
import sys
from pathlib import Path

# One BLAS thread per process (unless the environment says otherwise): `make test` runs two workers
# on two cores, and OpenBLAS's own threads then spin against the other worker's. Measured on two
# busy cores, a fixture's training took 0.5-1.3 s a step with OpenBLAS's threads, 0.2-0.3 s with one.
# Read when OpenBLAS loads (mlx_nb preloads it below); the servers the tests start inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import mlx_nb  # noqa: E402,F401  (must precede any mlx import)
import pytest

# Servers the tests start keep their prefix cache in memory only (their default folder is shared by
# every server of the same weights: one test's entries would be another's hits); tests of the disk
# cache name their own folder.
os.environ["MLX_NB_PREFIX_CACHE_DIR"] = ""

sys.path.insert(0, str(Path(__file__).parent))  # helpers shared by the test folders (forcing.py)

TINY_TEXT = ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3", "tiny-falcon-h1"]


# The files that take longest (about 35 s to 5 min each on two cores), longest first. `make test`
# hands whole files to its two workers in collection order (`--no-loadscope-reorder`), so these start
# first and the short files fill in around them, instead of one long file starting last and keeping
# one worker busy after the other has finished.
LONGEST_FIRST = [
    "tests/browser/test_browser_labextension.py",
    "tests/server/test_server_agents_live.py",
    "tests/engine/test_engine_kv_quant_sweep_rest.py",
    "tests/engine/test_engine_kv_quant_sweep.py",
    "tests/engine/test_engine_kv_quant_quality.py",
    "tests/engine/test_engine_draft.py",
    "tests/engine/test_engine_speculation.py",
    "tests/server/test_server_kernels.py",
    "tests/browser/test_browser_lab.py",
    "tests/server/test_server_kv_quant.py",
    "tests/server/test_server_models.py",
    "tests/engine/test_engine_constrained.py",
    "tests/training/test_training_jobs.py",
    "notebooks/09-fine-tuning.ipynb",
    "tests/browser/test_browser_thinking.py",
    "tests/engine/test_engine_memory.py",
    "tests/test_make_lab.py",
    "tests/browser/test_browser_escaping.py",
]


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONGEST_FIRST), then the rest in their usual order; a file's own
    tests keep theirs (a notebook's cells, a module's shared engine)."""
    root = Path(str(config.rootpath))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        try:
            return rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank))
        except ValueError:  # a file outside the repository, named on the command line
            return len(rank)

    items.sort(key=key)


@pytest.fixture(scope="session")
def tiny_text_names():
    return list(TINY_TEXT)
