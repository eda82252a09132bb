"""A quantized KV cache that batches (engine/caches/kv_quant.py): 8- and 4-bit keys and values as rows of
the shared batch, each row token for token what mlx_lm's `generate_step` gives that prompt alone with
mlx_lm's own `QuantizedKVCache` of the same setting.

Prompts of random lengths arrive in two waves (the second while the first decodes) with random
token budgets, then two are asked again (prefix-cache hits, cut back): merge, extend,
filter, the right-padding roll, extract and the prefix cache all run on quantized caches.
"""

import random
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from mlx_nb import Engine
from mlx_nb.compat.configs import write_tiny
from mlx_nb.compat.reference import quantized_cache, reply_tokens
from mlx_nb.engine.caches.kv_quant import BatchQuantizedKV, KVQuantization, QuantizedKV
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.magics.tables import cache_table, status_table
from mlx_nb.models import load_model

WIDE = {"head_dim": 32, "hidden_size": 128}  # heads of 32: the smallest group MLX quantizes
GROUP = 32


def _quantized_cache(loaded, bits: int, group: int = GROUP) -> list:
    """mlx_lm's own per-request quantized cache: its QuantizedKVCache for each plain KV layer."""
    return quantized_cache(loaded, bits, group)


def _waves(engine, loaded, texts: list[str], budgets: list[int], bits: int, group: int = GROUP) -> None:
    """Submit the first half, wait for its first tokens, submit the rest; every reply equals the reference."""
    prompts = [encode_prompt(loaded.tokenizer, t, chat=False) for t in texts]
    want = [reply_tokens(loaded, p, m, _quantized_cache(loaded, bits, group)) for p, m in zip(prompts, budgets)]
    half = len(texts) // 2
    first = [engine.submit(prompt=t, max_tokens=m) for t, m in zip(texts[:half], budgets[:half])]
    next(iter(first[0]))  # the first wave is decoding
    second = [engine.submit(prompt=t, max_tokens=m) for t, m in zip(texts[half:], budgets[half:])]
    got = [h.result(timeout=240) for h in first + second]
    # asked again once they finished: prefix-cache hits, cut back to the prompt
    again = [engine.submit(prompt=t, max_tokens=m) for t, m in zip(texts[:2], budgets[:2])]
    got += [h.result(timeout=240) for h in again]
    want += want[:2]
    texts, budgets = texts + texts[:2], budgets + budgets[:2]
    for i, r in enumerate(got):
        assert r.error is None, r.error
        assert r.token_ids == want[i], (i, texts[i], budgets[i])
    assert engine.status()["peak_batch_size"] > 1


def _texts(seed: int, n: int) -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(str(x) for x in rng.integers(0, 99, size=rng.integers(1, 40))) for _ in range(n)]
    return texts, rng.integers(3, 16, size=n).tolist()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "olmo2", "granite"])
@pytest.mark.parametrize("seed,bits", [(1, 8), (2, 4)])
def test_quantized_rows_in_one_batch_equal_mlx_lm_alone(arch, seed, bits, tmp_path):
    path = write_tiny(arch, tmp_path / arch, seed=seed, variant=WIDE)
    loaded = load_model(str(path))
    texts, budgets = _texts(seed, 10)
    with Engine(str(path), wait=True, kv_bits=bits, kv_group_size=GROUP, max_batch=8) as engine:
        assert engine.status()["kv_cache"] == {"bits": bits, "group_size": GROUP}
        _waves(engine, loaded, texts, budgets, bits)
        layers = engine.cache_layout()["layers"]
        assert {layer["type"] for layer in layers} == {"QuantizedKV"} and {layer["bits"] for layer in layers} == {bits}
        assert f"{bits}-bit keys and values (groups of {GROUP})" in repr(status_table(engine.status(), "engine"))
        assert f"{bits}-bit" in repr(cache_table(engine.cache_layout()))
        hits = engine.status()["prefix_cache"]["hits"]
        assert hits["trimmed"] + hits["exact"] + hits["shorter"] >= 1, hits


def test_fused_kernel_layers_read_quantized_keys_and_values(tmp_path):
    """Quantized for the kernels, qwen2's attention and decoder layers are fused; their attention
    reads the quantized cache the same way alone (mlx_lm's generate_step) and in the batch."""
    path = write_tiny("qwen2", tmp_path / "qwen2", seed=3, variant=WIDE)
    loaded = load_model(str(path), quantize=4)
    assert loaded.kernels["swapped"].get("attention") and loaded.kernels["swapped"].get("decoder layer")
    texts, budgets = _texts(3, 8)
    with Engine(str(path), wait=True, quantize=4, kv_bits=8, kv_group_size=GROUP) as engine:
        _waves(engine, loaded, texts, budgets, 8)


def test_the_sequential_lane_quantizes_too(tmp_path):
    path = write_tiny("qwen3", tmp_path / "qwen3", seed=4, variant=WIDE)
    loaded = load_model(str(path))
    texts, budgets = _texts(4, 4)
    prompts = [encode_prompt(loaded.tokenizer, t, chat=False) for t in texts]
    with Engine(str(path), wait=True, batch_policy="sequential", kv_bits=4, kv_group_size=GROUP) as engine:
        got = [engine.submit(prompt=t, max_tokens=m) for t, m in zip(texts, budgets)]
        for h, p, m in zip(got, prompts, budgets):
            assert h.result(timeout=120).token_ids == reply_tokens(loaded, p, m, _quantized_cache(loaded, 4))


def test_a_setting_the_model_cannot_hold_keeps_float_and_says_why(tmp_path):
    path = write_tiny("qwen3", tmp_path / "narrow", seed=5)  # heads of 16: no group of 32 fits
    loaded = load_model(str(path))
    prompt = encode_prompt(loaded.tokenizer, "1 2 3 4", chat=False)
    with Engine(str(path), wait=True, kv_bits=8, kv_group_size=32) as engine:
        kv = engine.status()["kv_cache"]
        assert kv["bits"] is None and "does not divide the head size 16" in kv["note"]
        assert "float (kv_group_size 32 does not divide" in repr(status_table(engine.status(), "engine"))
        assert engine.submit(prompt="1 2 3 4", max_tokens=6).result(timeout=60).token_ids == \
            reply_tokens(loaded, prompt, 6)
    for bad, field in ((3, "kv_bits"), (8.5, "kv_bits")):
        with pytest.raises(ValueError, match=field):
            Engine(str(path), kv_bits=bad)
    with pytest.raises(ValueError, match="kv_group_size"):
        Engine(str(path), kv_bits=8, kv_group_size=48)


def _dequantized(triple, group: int, bits: int) -> np.ndarray:
    return np.array(mx.dequantize(*triple, group_size=group, bits=bits).astype(mx.float32), dtype=np.float64)


@pytest.mark.parametrize("seed", range(4))
def test_batch_operations_keep_each_rows_keys_in_place(seed):
    """Random rows of random lengths merged, extended, stepped, filtered and rolled: each row's keys
    and values, dequantized, are exactly its own tokens' quantized alone, at its own positions."""
    rng = random.Random(seed)
    bits, heads, dims = rng.choice([4, 8]), rng.choice([1, 2]), rng.choice([32, 64])
    setting = KVQuantization(bits, GROUP)
    rows = {}

    def alone(x):  # one row's tokens quantized on their own, dequantized
        return _dequantized(mx.quantize(x, group_size=GROUP, bits=bits), GROUP, bits)

    def random_keys(n, batch=1):
        return [mx.random.normal((batch, heads, n, dims), key=mx.random.key(rng.randrange(2**31))) for _ in range(2)]

    def check(batch, names):
        ks, vs = batch.keys_and_values()
        pads = batch.left_padding.tolist()
        for i, name in enumerate(names):
            n = rows[name][0].shape[2]
            assert batch._idx - pads[i] == n and batch.offset.tolist()[i] == n
            for got, want in zip((ks, vs), rows[name]):
                assert np.array_equal(_dequantized(tuple(a[i:i + 1, :, pads[i]:] for a in got), GROUP, bits), want), name
            if pads[i]:  # padding dequantizes to zeros
                assert np.all(_dequantized(tuple(a[i:i + 1, :, :pads[i]] for a in ks), GROUP, bits) == 0)

    def batch_of(lengths, prefix):
        made, names = [], []
        for j, n in enumerate(lengths):
            k, v = random_keys(n)
            c = KVCache()
            c.update_and_fetch(k, v)
            made.append(setting.convert([c])[0])
            names.append(f"{prefix}{j}")
            rows[names[-1]] = (alone(k), alone(v))
        return BatchQuantizedKV.merge(made), names

    a, names = batch_of([rng.randint(1, 40) for _ in range(rng.randint(2, 4))], "a")
    check(a, names)
    b, more = batch_of([rng.randint(1, 300) for _ in range(rng.randint(1, 3))], "b")
    a.extend(b)
    names += more
    check(a, names)
    k, v = random_keys(1, len(names))  # one decode step for every row
    a.update_and_fetch(k, v)
    for i, name in enumerate(names):
        rows[name] = tuple(np.concatenate([r, alone(x[i:i + 1])], axis=2) for r, x in zip(rows[name], (k, v)))
    check(a, names)
    keep = sorted(rng.sample(range(len(names)), len(names) - 1))  # a row leaves
    a.filter(keep)
    names = [names[i] for i in keep]
    check(a, names)
    out = a.extract(0)
    assert isinstance(out, QuantizedKV) and out.offset == rows[names[0]][0].shape[2]
    assert np.array_equal(_dequantized(out.keys, GROUP, bits), rows[names[0]][0])
    # two rows read right-padded prompts of 4 and 1 tokens: after the roll both end at the last position
    batch = BatchQuantizedKV.merge([QuantizedKV(group_size=GROUP, bits=bits) for _ in range(2)])
    k, v = random_keys(4, 2)
    batch.prepare(right_padding=[0, 3])
    batch.update_and_fetch(k, v)
    batch.finalize()
    assert batch.left_padding.tolist() == [0, 3] and batch.offset.tolist() == [4, 1]
    last = _dequantized(tuple(t[1:2, :, 3:] for t in batch.keys_and_values()[0]), GROUP, bits)
    assert np.array_equal(last, alone(k[1:2, :, :1]))


@pytest.mark.parametrize("seed", [1, 2])
def test_quantized_prefix_cache_survives_a_restart_and_float_engines_never_read_it(seed, tmp_path):
    """Entries are written as mlx_lm's QuantizedKVCache, read back into the batch after a restart, and
    kept apart from a float engine's (and another setting's) entries of the same weights."""
    path = write_tiny("qwen3", tmp_path / "qwen3", seed=seed, variant=WIDE)
    loaded = load_model(str(path))
    rng = random.Random(seed)
    system = " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(160, 220)))
    texts = [f"{system} {rng.randint(0, 99)} {rng.randint(0, 99)}" for _ in range(2)]
    prompts = [encode_prompt(loaded.tokenizer, t, chat=False) for t in texts]
    want = [reply_tokens(loaded, p, 8, _quantized_cache(loaded, 8)) for p in prompts]
    folder = str(tmp_path / "prefix")
    with Engine(str(path), prefix_cache_dir=folder, kv_bits=8, kv_group_size=GROUP, wait=True) as before:
        assert before.submit(prompt=texts[0], max_tokens=8).result(timeout=120).token_ids == want[0]
    for other in (dict(), dict(kv_bits=4, kv_group_size=GROUP)):  # float, and 4-bit: their own folders
        with Engine(str(path), prefix_cache_dir=folder, wait=True, **other) as engine:
            assert engine.status()["prefix_cache"]["disk"]["entries"] == 0
    with Engine(str(path), prefix_cache_dir=folder, kv_bits=8, kv_group_size=GROUP, wait=True) as after:
        assert after.status()["prefix_cache"]["disk"]["entries"] >= 1
        got = [after.submit(prompt=t, max_tokens=8).result(timeout=120) for t in texts]
        stats = after.status()["prefix_cache"]
    assert [r.token_ids for r in got] == want
    assert stats["hits"]["disk"] >= 1 and got[0].usage.cached_tokens >= 128 and stats["disk"]["ignored"] == 0
