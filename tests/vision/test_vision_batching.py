"""A vision model's cache layout, loaded and live: the language model's own caches plus, for an
mRoPE family, the RopeDeltaCache that carries each row's position delta (one int32).

(That every family's batched tokens equal mlx_vlm's own generation is test_vision_families.py.)
"""

import pytest

from mlx_nb import Engine
from vision_reference import data_url, picture

LAYOUTS = {  # the language model's caches, then the per-row delta for mRoPE families
    "tiny-qwen3.5-vl": ["ArraysCache", "KVCache", "ArraysCache", "KVCache", "RopeDeltaCache"],
    "tiny-qwen3-vl": ["KVCache", "KVCache", "RopeDeltaCache"],
    "tiny-gemma3-vl": ["RotatingKVCache", "KVCache", "RotatingKVCache", "KVCache"],
}
SQUARE = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture(56, 56, 1))}},
                                       {"type": "text", "text": "What is this?"}]}]


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def vision_case(request):
    with Engine(request.param, max_batch=8, prefill_step_size=16, wait=True) as engine:
        yield request.param, engine


def test_loaded_as_vision_model(vision_case):
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    name, engine = vision_case
    loaded = engine.loaded
    assert loaded.kind == "vision" and loaded.vision_model is not None and loaded.processor is not None
    assert isinstance(loaded.tokenizer, TokenizerWrapper)
    assert loaded.cache_types() == LAYOUTS[name]


def test_cache_layout_of_a_live_vision_request(vision_case):
    import mlx.core as mx

    name, engine = vision_case
    eos = engine.loaded.tokenizer.eos_token_ids

    def no_eos(tokens, logits):  # keep the request alive while its layout is read
        banned = mx.zeros(logits.shape[-1], dtype=mx.bool_)
        for t in eos:
            banned = banned | (mx.arange(logits.shape[-1]) == t)
        return mx.where(banned[None], -1e9, logits)

    h = engine.submit(messages=SQUARE, max_tokens=200, logits_processors=[no_eos])
    next(iter(h))
    layout = engine.cache_layout(h.id)
    h.abort()
    types = [layer["type"] for layer in layout["layers"]]
    assert types == LAYOUTS[name]
    if types[-1] == "RopeDeltaCache":
        assert layout["layers"][-1]["nbytes"] == 4  # one int32 delta
    assert all(layer["nbytes"] > 0 for layer in layout["layers"])
    assert h.result(timeout=60).finish_reason == "abort"
