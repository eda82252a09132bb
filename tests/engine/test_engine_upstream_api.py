"""When an upstream tuple grows a field, a positional unpack crashes (a real bug in a peer server's
chunked prefill). We only use mlx_lm's
keyword APIs and named response fields; this test names exactly what we rely on, so an mlx_lm
upgrade that changes them fails here with a clear message instead of deep inside a batch."""

import dataclasses
import inspect

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


def test_next_returns_prompt_and_generation_responses():
    from mlx_nb.models import load_model

    loaded = load_model("tiny-llama")
    bg = BatchGenerator(loaded.model)
    bg.insert_segments(segments=[[[1, 2, 3]]], max_tokens=[2])
    out = bg.next()
    assert isinstance(out, tuple) and len(out) == 2, "BatchGenerator.next() no longer returns (prompt, generation)"
