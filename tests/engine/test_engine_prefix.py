"""Prefix reuse gives exactly the cold text; hybrid caches are never trimmed; the budget holds."""

import pytest

from mlx_nb import Engine
from mlx_lm.models.cache import can_trim_prompt_cache
from mlx_nb.engine.caches.prefix import PrefixCache, owned

SYSTEM = "You are a terse assistant. " * 6  # long enough to cross tiny-gemma3's window of 8
MAX = 12


def turns(engine, questions):
    """A conversation: each turn re-sends the whole history, as %%mlx chat does."""
    history = [{"role": "system", "content": SYSTEM}]
    results = []
    for q in questions:
        history.append({"role": "user", "content": q})
        r = engine.submit(messages=list(history), max_tokens=MAX).result(timeout=120)
        history.append({"role": "assistant", "content": r.text})
        results.append(r)
    return results


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3"])
def test_warm_equals_cold(name):
    questions = ["first question", "second one", "third and last"]
    shared = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"q{i}"}] for i in range(2)]
    with Engine(name, prefix_cache=False, wait=True) as cold:
        cold_turns = turns(cold, questions)
        cold_shared = [cold.submit(messages=m, max_tokens=MAX).result() for m in shared]
        assert cold.status()["prefix_cache"] == {"enabled": False}
    with Engine(name, wait=True) as warm:
        warm_turns = turns(warm, questions)
        warm_shared = [warm.submit(messages=m, max_tokens=MAX).result() for m in shared]
        stats = warm.status()["prefix_cache"]
    for c, w in zip(cold_turns + cold_shared, warm_turns + warm_shared):
        assert w.token_ids == c.token_ids, f"{name}: a cache hit changed the output"
    assert warm_turns[1].usage.cached_tokens > 0 and warm_turns[2].usage.cached_tokens > 0
    assert warm_shared[1].usage.cached_tokens >= len(SYSTEM) // 2, "the shared system prompt was not reused"
    assert stats["tokens_saved"] > 0 and stats["hits"]["miss"] >= 1
    assert sum(stats["hits"][k] for k in ("exact", "shorter", "trimmed")) >= 3
    if name == "tiny-qwen3.5":  # SSM state can't be cut back: only whole entries are ever reused
        assert stats["hits"]["trimmed"] == 0 and stats["hits"]["shorter"] >= 3, stats["hits"]


def test_upstream_trim_check_covers_every_layer():
    """PrefixCache trims only when mlx_lm's `can_trim_prompt_cache` says so: pin that it looks at
    EVERY layer, so an upstream change to a first-layer check (seed 001) fails here, loudly."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    assert can_trim_prompt_cache([KVCache(), KVCache()])
    assert not can_trim_prompt_cache([KVCache(), ArraysCache(2)])  # a first-layer check would say True
    assert not can_trim_prompt_cache([ArraysCache(2), KVCache()])
    wrapped = RotatingKVCache(max_size=4)
    import mlx.core as mx

    wrapped.update_and_fetch(mx.zeros((1, 1, 6, 4)), mx.zeros((1, 1, 6, 4)))
    assert not can_trim_prompt_cache([KVCache(), wrapped])


def test_hybrid_cache_is_never_trimmed_to_a_shorter_prefix():
    from mlx_lm.models.cache import ArraysCache, KVCache
    import mlx.core as mx

    cache = PrefixCache("m")
    kv, ssm = KVCache(), ArraysCache(2)
    kv.update_and_fetch(mx.zeros((1, 2, 6, 4)), mx.zeros((1, 2, 6, 4)))
    ssm[0], ssm[1] = mx.ones((1, 3, 8)), mx.ones((1, 2, 4, 4))
    cache.store([1, 2, 3, 4, 5, 6], [kv, ssm])
    hit, cached, kind = cache.lookup([1, 2, 3, 9, 9])  # diverges inside the stored entry
    assert hit is None and cached == 0 and kind == "miss"
    hit, cached, kind = cache.lookup([1, 2, 3, 4, 5, 6, 7])  # extends it: the whole entry is reused
    assert cached == 6 and kind == "shorter"


def test_trimmable_cache_is_trimmed_back_to_the_common_prefix():
    from mlx_lm.models.cache import KVCache
    import mlx.core as mx

    cache = PrefixCache("m")
    kv = KVCache()
    kv.update_and_fetch(mx.zeros((1, 2, 6, 4)), mx.zeros((1, 2, 6, 4)))
    cache.store([1, 2, 3, 4, 5, 6], [kv])
    hit, cached, kind = cache.lookup([1, 2, 3, 9, 9])
    assert kind == "trimmed" and cached == 3 and hit[0].offset == 3


def test_eviction_respects_the_byte_budget():
    from mlx_lm.models.cache import KVCache
    import mlx.core as mx

    def entry():
        kv = KVCache()
        kv.update_and_fetch(mx.zeros((1, 2, 64, 16)), mx.zeros((1, 2, 64, 16)))
        return [kv]

    one = owned(entry())[0].nbytes  # stored entries are cut to what they hold (64 of 256 positions)
    assert one == 2 * 2 * 64 * 16 * 4
    cache = PrefixCache("m", max_bytes=3 * one + 10)
    for i in range(10):
        cache.store([1000 + i, 1, 2], entry())
        assert cache.status()["bytes"] <= cache.max_bytes
    assert cache.status()["entries"] == 3
    assert cache.lookup([1009, 1, 2, 5])[2] != "miss" and cache.lookup([1000, 1, 2, 5])[2] == "miss"


def test_long_prompt_prefill_is_chunked_between_decode_steps():
    with Engine("tiny-llama", prefill_step_size=32, prefix_cache=False, wait=True) as engine:
        runner = engine.submit(prompt="go", max_tokens=400)
        it = iter(runner)
        next(it)
        long = engine.submit(prompt="lorem ipsum " * 200, max_tokens=4)
        long.result(timeout=120)
        runner.abort()
        events = engine.events()
    pre = [e for e in events if e["kind"] == "prefill" and long.id in e["requests"]]
    assert len(pre) >= 10, "the long prompt was not processed in chunks"
    first, last = pre[0]["seq"], pre[-1]["seq"]
    decode_during = [e for e in events if e["kind"] == "step" and first < e["seq"] < last and runner.id in e["requests"]]
    assert len(decode_during) >= len(pre) - 1, "the running stream stalled while the long prompt was read"
