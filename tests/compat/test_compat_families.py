"""The fast subset of the sweep: one architecture per cache family, through the real engine with
the batching policy it takes from the shipped matrix, against mlx_lm's generate_step alone.

Three prompts decode while three more join, one request is aborted mid-decode, and a second chat
turn reuses the first's cache: every row must equal the reference, token for token.
"""

import pytest

from mlx_nb.compat import checks, matrix
from mlx_nb.compat.configs import write_tiny
from mlx_nb.models import load_model


def leaves(cache_types) -> set:
    return matrix.leaf_types(cache_types)


# family -> (architecture, what its caches must show so the family really is covered)
FAMILIES = {
    "plain KV": ("qwen3", lambda t: leaves(t) == {"KVCache"}),
    "sliding window": ("gemma3_text", lambda t: {"RotatingKVCache", "KVCache"} <= leaves(t)),
    "mamba-style SSM": ("mamba", lambda t: leaves(t) == {"ArraysCache"}),
    "RWKV": ("rwkv7", lambda t: leaves(t) == {"ArraysCache"}),
    "other recurrent (RG-LRU + local attention)": ("recurrent_gemma", lambda t: "ArraysCache" in leaves(t)),
    "CacheList hybrid": ("falcon_h1", lambda t: any(isinstance(x, list) for x in t)),
    "gated delta + attention": ("qwen3_next", lambda t: {"ArraysCache", "KVCache"} <= leaves(t)),
    "multi-head latent attention": ("deepseek_v3", lambda t: leaves(t) == {"KVCache"}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_cache_family_batched_equals_the_reference(family, tmp_path):
    arch, shows_family = FAMILIES[family]
    path = str(write_tiny(arch, tmp_path / arch))
    loaded = load_model(path)
    types = loaded.cache_types()
    want = checks.expected(loaded)  # before any engine: MLX is used by one thread at a time
    del loaded
    assert shows_family(types), f"{arch}'s tiny instance does not have {family} caches: {types}"

    run = checks.run_engine(path, None, want)  # None: the policy the engine takes from the matrix

    verdict = matrix.entries("mlx_lm")[arch]["verdict"]
    if verdict == "batched" and leaves(types) != {"KVCache"}:
        # checked on these weights at load: confirmed, or overruled (rwkv7's state reads the padding
        # on this draw although its greedy tokens agreed when the matrix was measured)
        assert run.policy["check"] is not None, run.policy
        expected = ("matrix", "batched") if run.policy["check"]["agrees"] else ("checked", "prefill_alone")
        assert (run.policy["source"], run.policy["mode"]) == expected, run.policy
    else:
        assert (run.policy["source"], run.policy["mode"]) == ("matrix", verdict), run.policy
    assert run.error is None, f"{arch}: {run.error}"
    assert run.differs == [], f"{arch} ({run.policy['mode']}): rows {run.differs} differ from generate_step alone"
    if run.policy["mode"] == "sequential":  # one request at a time: nothing joins, they queue
        assert run.sequential_ok, run.checks
    else:
        assert run.checks["late_join"] and run.checks["abort"], run.checks
    assert run.checks["prefix"] is not False, f"{arch}: the warm second turn differs from a cold run"
