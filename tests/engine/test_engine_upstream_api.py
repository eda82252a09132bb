"""When an upstream tuple grows a field, a positional unpack crashes (a real bug in a peer server's
chunked prefill). We only use mlx_lm's
keyword APIs and named response fields; this test names exactly what we rely on, so an mlx_lm
upgrade that changes them fails here with a clear message instead of deep inside a batch."""

import dataclasses
import inspect

import pytest

from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import LRUPromptCache

USED_KEYWORDS = {
    BatchGenerator.__init__: {"stop_tokens", "completion_batch_size", "prefill_batch_size", "prefill_step_size"},
    BatchGenerator.insert_segments: {"segments", "max_tokens", "caches", "all_tokens", "samplers", "logits_processors"},
    BatchGenerator.remove: {"uids"},
    BatchGenerator.extract_cache: {"uids"},
    LRUPromptCache.__init__: {"max_size", "max_bytes"},
    LRUPromptCache.insert_cache: {"model", "tokens", "prompt_cache", "cache_type"},
    LRUPromptCache.fetch_nearest_cache: {"model", "tokens"},
}
USED_FIELDS = {
    GenerationBatch.Response: {"uid", "token", "logprobs", "finish_reason", "prompt_cache", "all_tokens"},
    PromptProcessingBatch.Response: {"uid", "progress", "end_of_segment", "end_of_prompt"},
}


def test_batch_generator_keyword_api_is_what_we_use():
    for fn, names in USED_KEYWORDS.items():
        params = set(inspect.signature(fn).parameters)
        missing = names - params
        assert not missing, f"mlx_lm changed {fn.__qualname__}: no parameter(s) {sorted(missing)}; pin mlx-lm or adapt"


def test_response_fields_are_what_we_read():
    for cls, names in USED_FIELDS.items():
        have = {f.name for f in dataclasses.fields(cls)}
        missing = names - have
        assert not missing, f"mlx_lm changed {cls.__qualname__}: no field(s) {sorted(missing)}; pin mlx-lm or adapt"


def test_every_upstream_tuple_we_unpack_has_the_shape_we_expect():
    """Each unpack goes through mlx_nb.engine.batch.upstream; run each one on real return values."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from mlx_nb.engine.batch import upstream
    from mlx_nb.models import load_model

    loaded = load_model("tiny-llama")
    bg = BatchGenerator(loaded.model, prefill_step_size=2)
    (uid,) = bg.insert_segments(segments=[[[1, 2, 3], [4, 5]]], max_tokens=[3])
    seen_progress = []
    for _ in range(20):
        prompt, generation = upstream.responses(bg.next())
        seen_progress += [upstream.progress(r) for r in prompt]
        for r in prompt:
            if r.end_of_segment and not r.end_of_prompt:
                cache, tokens = upstream.extracted(bg.extract_cache([uid]), uid)
                done, _total = upstream.progress(r)
                assert tokens == [1, 2, 3, 4][:done] and [c.offset for c in cache] == [done] * len(cache)
        if generation:
            break
    assert generation and seen_progress and all(done <= total for done, total in seen_progress)

    lru = LRUPromptCache(max_size=4)
    kv = KVCache()
    kv.update_and_fetch(mx.zeros((1, 1, 3, 4)), mx.zeros((1, 1, 3, 4)))
    lru.insert_cache(model="m", tokens=[1, 2, 3], prompt_cache=[kv], cache_type="user")
    cache, rest = upstream.nearest(lru.fetch_nearest_cache(model="m", tokens=[1, 2, 3]))
    assert cache is not None and rest == []


def test_a_changed_shape_fails_with_one_line_saying_what_to_do():
    from mlx_nb.engine.batch.upstream import UpstreamAPIError, extracted

    with pytest.raises(UpstreamAPIError) as err:
        extracted({7: ("cache", [1, 2], "a new field")}, 7)
    assert "extract_cache returned 3 items, expected 2" in str(err.value) and "\n" not in str(err.value)
