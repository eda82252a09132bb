"""Vision requests share the batch with text requests and give exactly their one-at-a-time tokens.

For a hybrid (ArraysCache + KVCache) and a pure-KVCache vision-language model: two image requests
of different sizes, two text-only requests and one image request joining mid-decode all equal
mlx_vlm's own single-request greedy output. The fixtures' q/k norms make attention (and so every
mRoPE position) matter, so a wrong rope delta or a lost cache update changes the tokens.
"""

import numpy as np
import pytest

from mlx_nb import Engine
from mlx_nb.models import load_model
from vision_reference import MAX_TOKENS, data_url, picture, vlm_greedy

SQUARE, WIDE, LATE = picture(56, 56, 1), picture(56, 28, 2), picture(84, 56, 3)


def image(img):
    return {"type": "image", "image": img}


CASES = {  # name -> (messages, images as the reference gets them)
    "square": ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(SQUARE)}},
                                             {"type": "text", "text": "What is this?"}]}], [SQUARE]),
    "wide": ([{"role": "system", "content": "Answer briefly."},
              {"role": "user", "content": [{"type": "text", "text": "Look:"}, image(WIDE)]}], [WIDE]),
    "text": ([{"role": "user", "content": "Tell me a story."}], []),
    "text2": ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "user", "content": "again"}], []),
    "late": ([{"role": "user", "content": [image(np.asarray(LATE)), {"type": "text", "text": "and this?"}]}], [LATE]),
}


@pytest.fixture(scope="module", params=["tiny-qwen3.5-vl", "tiny-qwen3-vl"])
def vision_case(request):
    name = request.param
    loaded = load_model(name)
    refs = {key: vlm_greedy(loaded, msgs, imgs) for key, (msgs, imgs) in CASES.items()}
    expanded = {key: len(loaded.processor(text=[_text(loaded, msgs)], images=imgs, add_special_tokens=False)["input_ids"][0])
                for key, (msgs, imgs) in CASES.items() if imgs}
    del loaded
    with Engine(name, max_batch=8, prefill_step_size=16, wait=True) as engine:
        yield name, engine, refs, expanded


def _text(loaded, messages):
    from mlx_nb.engine.messages import normalize_messages
    from mlx_nb.engine.vision import render_vision_prompt

    return render_vision_prompt(loaded, normalize_messages(messages))


def test_loaded_as_vision_model(vision_case):
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    name, engine, _, _ = vision_case
    loaded = engine.loaded
    assert loaded.kind == "vision" and loaded.vision_model is not None and loaded.processor is not None
    assert isinstance(loaded.tokenizer, TokenizerWrapper)
    expected = {"tiny-qwen3.5-vl": ["ArraysCache", "KVCache", "ArraysCache", "KVCache", "RopeDeltaCache"],
                "tiny-qwen3-vl": ["KVCache", "KVCache", "RopeDeltaCache"]}[name]
    assert loaded.cache_types() == expected


def test_mixed_batch_with_late_image_request_matches_alone(vision_case):
    name, engine, refs, expanded = vision_case
    first = {key: engine.submit(messages=CASES[key][0], max_tokens=MAX_TOKENS) for key in ("square", "wide", "text", "text2")}
    stream = iter(first["square"])
    next(stream)  # the batch is decoding now
    late = engine.submit(messages=CASES["late"][0], max_tokens=MAX_TOKENS)
    results = {key: h.result(timeout=120) for key, h in {**first, "late": late}.items()}
    for key, r in results.items():
        assert r.error is None, r.error
        assert r.token_ids == refs[key], f"{name}: {key} differs from its one-at-a-time output"
    for key, n in expanded.items():  # usage counts the image tokens the processor expanded
        assert results[key].usage.prompt_tokens == n
    events = engine.events()
    joined = [e for e in events if e["kind"] == "extend" and late.id in e["requests"]]
    assert joined and joined[-1]["detail"]["batch_size"] >= 2, "the late image request did not join a running batch"
    assert any(e["kind"] == "step" and len(e["requests"]) >= 3 for e in events)


def test_cache_layout_of_a_live_vision_request(vision_case):
    import mlx.core as mx

    name, engine, _, _ = vision_case
    eos = engine.loaded.tokenizer.eos_token_ids

    def no_eos(tokens, logits):  # keep the request alive while its layout is read
        banned = mx.zeros(logits.shape[-1], dtype=mx.bool_)
        for t in eos:
            banned = banned | (mx.arange(logits.shape[-1]) == t)
        return mx.where(banned[None], -1e9, logits)

    h = engine.submit(messages=CASES["square"][0], max_tokens=200, logits_processors=[no_eos])
    next(iter(h))
    layout = engine.cache_layout(h.id)
    h.abort()
    types = [layer["type"] for layer in layout["layers"]]
    assert types[-1] == "RopeDeltaCache" and layout["layers"][-1]["nbytes"] == 4  # one int32 delta
    assert all(layer["nbytes"] > 0 for layer in layout["layers"])
    if name == "tiny-qwen3.5-vl":
        assert types[:-1] == ["ArraysCache", "KVCache", "ArraysCache", "KVCache"]
    else:
        assert types[:-1] == ["KVCache", "KVCache"]
    assert h.result(timeout=60).finish_reason == "abort"
