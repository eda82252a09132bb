"""The quantized-KV sweep (its two test files run half each, so the suite's two workers share it).

Quantized keys and values over every architecture the compatibility matrix batches: each one with a
plain KV layer, built tiny with heads of 32 (the smallest group MLX quantizes), serves 8-bit rows in
one batch token for token as mlx_lm's generate_step alone with its QuantizedKVCache; one whose
attention cannot read a quantized cache is served float, its reason in status. None is left out
unnoticed: each quarter of the sweep fails if fewer than half of its architectures were compared."""

import random

from mlx_nb import Engine
from mlx_nb.compat import matrix
from mlx_nb.compat.configs import write_tiny
from mlx_nb.compat.reference import quantized_cache, reply_tokens
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.models import load_model

WIDE = {"head_dim": 32, "hidden_size": 128, "d_model": 128, "n_embd": 128, "dim": 128, "kv_channels": 32,
        "qk_head_dim": 32, "hidden_size_per_head": 32}
SERVED = ("batched", "prefill_alone")


def architectures() -> list[str]:
    entries = (matrix.read("mlx_lm") or {}).get("entries", [])
    return sorted(e["architecture"] for e in entries if e["verdict"] in SERVED and "KVCache" in str(e["cache_types"]))


def one(arch: str, root) -> str:
    """'compared', 'float: <why>' or 'not built: <why>' for this architecture."""
    try:
        path = write_tiny(arch, root / arch, seed=7, variant=WIDE)
        loaded = load_model(str(path))
    except Exception as exc:  # this config's heads cannot be widened: nothing to compare
        return f"not built: {type(exc).__name__}"
    rng = random.Random(arch)
    texts = [" ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 30))) for _ in range(4)]
    try:
        engine = Engine(str(path), wait=True, kv_bits=8, kv_group_size=32, prefix_cache=False)
    except Exception as exc:  # the widened instance fails the load-time batch check, before any KV setting
        try:
            Engine(str(path), wait=True, prefix_cache=False).close()
        except Exception:
            return f"not built: float fails too ({type(exc).__name__})"
        raise AssertionError(f"{arch}: loads float but not with 8-bit keys ({exc})") from None
    with engine:
        kv = engine.status()["kv_cache"]
        if kv["bits"] is None:
            ref = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), 8) for t in texts[:2]]
            got = [engine.submit(prompt=t, max_tokens=8).result(timeout=120).token_ids for t in texts[:2]]
            assert got == ref, f"{arch}: served float, but not as float alone"
            return f"float: {kv['note']}"
        handles = [engine.submit(prompt=t, max_tokens=8) for t in texts]
        got = [h.result(timeout=120) for h in handles]
    for t, r in zip(texts, got):
        want = reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), 8, quantized_cache(loaded, 8, 32))
        assert r.error is None and r.token_ids == want, (arch, t)
    return "compared"


SHARDS = 4  # interleaved quarters; each test file runs two


def sweep_shard(shard: int, root) -> None:
    """Every architecture of one quarter: none wrong, at least half compared."""
    arches = architectures()[shard::SHARDS]
    outcome = {}
    for arch in arches:
        try:
            outcome[arch] = one(arch, root)
        except AssertionError as exc:
            outcome[arch] = f"WRONG: {str(exc).splitlines()[0]}"
    wrong = {a: o for a, o in outcome.items() if o.startswith("WRONG")}
    assert not wrong, wrong
    compared = [a for a, o in outcome.items() if o == "compared"]
    others = {a: o for a, o in outcome.items() if o != "compared"}
    print(f"{len(compared)} of {len(arches)} compared; the others: {others}")
    assert len(compared) >= 0.5 * len(arches), others
