"""How an architecture may batch, decided from the measured matrix: batched, prefilled alone,
served one request at a time, or refused at load with a one-line reason; when the matrix has never
seen it, the safe path (plain KV caches batch, any other
cache is prefilled one request at a time), said in status().

The models are real mlx_lm architectures built tiny with random weights (configs generated from
each module's ModelArgs).
"""

import json

import pytest

from mlx_nb import Engine
from mlx_nb.compat import matrix
from mlx_nb.compat.configs import write_tiny
from mlx_nb.engine.batch.batchability import decide
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.models import ModelLoadError, load_model
from reference import reply_tokens

PROMPTS = ["a", "a much longer prompt than the others, " * 3, "one of middle length"]


def test_a_model_whose_cache_cannot_merge_is_served_one_request_at_a_time(tmp_path):
    """llama4 reads its context in chunks: ChunkedKVCache has no merge, so its rows cannot batch;
    they are served one at a time through generate_step, token for token."""
    path = str(write_tiny("llama4", tmp_path / "llama4"))
    loaded = load_model(path)
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, p, chat=False), 8) for p in PROMPTS]
    del loaded
    with Engine(path, wait=True) as engine:
        policy = engine.status()["policy"]
        assert (policy["mode"], policy["source"]) == ("sequential", "caches") and "ChunkedKVCache" in policy["reason"]
        together = [engine.submit(prompt=p, max_tokens=8) for p in PROMPTS]
        assert [h.result(timeout=120).token_ids for h in together] == want
        assert engine.status()["peak_batch_size"] == 1


def test_the_matrix_verdicts_sequential_and_refused_at_load(tmp_path, monkeypatch):
    """A `sequential` architecture is served one request at a time; a `refused` one (wrong even
    then) fails to load in one line naming the reason and the page that lists it."""
    data = matrix.read("mlx_lm", matrix.HERE)
    for e in data["entries"]:
        if e["architecture"] == "llama":
            e.update(verdict="refused", reason="wrong even one request at a time")
        if e["architecture"] == "gemma3_text":
            e.update(verdict="sequential", reason="rows drift in batched decoding")
    (tmp_path / "mlx_lm.json").write_text(json.dumps(data))
    monkeypatch.setenv("MLX_NB_COMPAT_DIR", str(tmp_path))
    engine = Engine("tiny-llama")
    with pytest.raises(ModelLoadError) as err:
        engine.wait_ready(120)
    message = str(err.value)
    assert "\n" not in message and "tiny-llama cannot run here: llama: wrong even one request at a time" in message
    assert "docs/compatibility.md" in message
    engine.close()
    with Engine("tiny-gemma3", wait=True) as engine:
        policy = engine.status()["policy"]
        assert (policy["mode"], policy["source"]) == ("sequential", "matrix")
        assert "rows drift in batched decoding" in policy["reason"]
        assert all(h.result(timeout=120).error is None for h in [engine.submit(prompt=p, max_tokens=4) for p in PROMPTS])


def test_no_architecture_that_runs_here_is_refused():
    """`refused` is only for a model wrong even one request at a time: every text architecture the
    sweep ran alone is served, batched or not."""
    for package in ("mlx_lm", "mlx_vlm"):
        for arch, e in matrix.entries(package).items():
            assert e["verdict"] != "refused", (arch, e["reason"])


def test_an_architecture_absent_from_the_matrix_takes_the_safe_path():
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

    kv = decide("brand_new_arch", [KVCache(), KVCache()], entries={})
    assert (kv.mode, kv.source) == ("batched", "unseen")
    assert "brand_new_arch is not in the compatibility matrix" in kv.reason
    for caches in ([ArraysCache(2), KVCache()], [CacheList(ArraysCache(2), KVCache())], [RotatingKVCache(8)]):
        policy = decide("brand_new_arch", caches, entries={})
        assert (policy.mode, policy.source) == ("prefill_alone", "unseen"), caches


def test_a_verdict_covers_only_the_cache_types_and_the_version_it_was_measured_with():
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    entries = {"some_arch": {"verdict": "batched", "reason": "measured", "cache_types": ["KVCache", "ArraysCache"]}}
    assert decide("some_arch", [KVCache()], entries=entries).source == "matrix"
    wider = decide("some_arch", [ArraysCache(2), RotatingKVCache(8)], entries=entries)
    assert (wider.mode, wider.source) == ("prefill_alone", "unseen") and "RotatingKVCache" in wider.reason
    newer = "measured with mlx-lm 0.32.2, installed 9.9.9"
    stale = decide("some_arch", [ArraysCache(2), KVCache()], entries=entries, stale=newer)
    assert (stale.mode, stale.source) == ("prefill_alone", "unseen") and newer in stale.reason
    assert decide("some_arch", [KVCache()], entries=entries, stale=newer).mode == "batched"  # plain KV


def test_engine_loads_an_unseen_architecture_the_safe_way_and_says_so(tmp_path, monkeypatch):
    """The shipped data minus falcon_h1 and llama: falcon_h1 (SSM + attention in a CacheList) is
    prefilled one request at a time, llama (plain KV) batches; both still match generate_step."""
    data = matrix.read("mlx_lm", matrix.HERE)
    data["entries"] = [e for e in data["entries"] if e["architecture"] not in ("falcon_h1", "llama")]
    (tmp_path / "mlx_lm.json").write_text(json.dumps(data))
    monkeypatch.setenv("MLX_NB_COMPAT_DIR", str(tmp_path))
    for name, arch, mode in (("tiny-falcon-h1", "falcon_h1", "prefill_alone"), ("tiny-llama", "llama", "batched")):
        loaded = load_model(name)
        want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, p, chat=False), 8) for p in PROMPTS]
        del loaded
        with Engine(name, prefix_cache=False, wait=True) as engine:
            policy = engine.status()["policy"]
            assert (policy["mode"], policy["source"], policy["architecture"]) == (mode, "unseen", arch)
            assert f"{arch} is not in the compatibility matrix" in policy["reason"]
            assert engine.status()["prefill_batch"] == (1 if mode == "prefill_alone" else 32)
            together = [engine.submit(prompt=p, max_tokens=8) for p in PROMPTS]
            assert [h.result(timeout=120).token_ids for h in together] == want


def test_which_cache_types_can_join_a_batch():
    """The load-time check behind the first refusal, for every mlx_lm cache type (a quantized KV
    cache must be refused clearly, never crash mid-batch)."""
    from mlx_lm.models.cache import (
        ArraysCache, CacheList, ChunkedKVCache, KVCache, QuantizedKVCache, RotatingKVCache,
    )

    from mlx_nb.engine.caches.layout import is_batchable

    assert is_batchable(KVCache()) and is_batchable(ArraysCache(2)) and is_batchable(RotatingKVCache(8))
    assert is_batchable(CacheList(ArraysCache(2), KVCache()))
    assert not is_batchable(QuantizedKVCache())
    assert not is_batchable(ChunkedKVCache(8))
    assert not is_batchable(RotatingKVCache(8, keep=4))  # batched rotating caches keep nothing
    assert not is_batchable(CacheList(ArraysCache(2), QuantizedKVCache()))
    alone = decide("any", [KVCache(), CacheList(ArraysCache(2), QuantizedKVCache())], entries={})
    assert alone.mode == "sequential" and "QuantizedKVCache" in alone.reason
    assert decide("any", [ChunkedKVCache(8)], forced="batched", entries={}).mode == "sequential"


def test_the_matrix_is_looked_up_by_the_module_that_built_the_model(tmp_path):
    """solar_open re-exports glm4_moe's Model: it is still looked up as solar_open, its own entry."""
    from mlx_nb.engine.batch.batchability import architecture_of

    assert architecture_of(load_model(str(write_tiny("solar_open", tmp_path / "s")))) == ("mlx_lm", "solar_open")
    assert architecture_of(load_model("tiny-gemma3")) == ("mlx_lm", "gemma3_text")
