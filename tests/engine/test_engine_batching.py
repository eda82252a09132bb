"""Batched output equals one-at-a-time output, token for token, for every cache layout.

The tiny fixtures have random weights, so their text is noise; what is checked is that joining,
sharing and leaving the batch never changes a single token.
"""

import pytest

from mlx_nb import Engine
from mlx_nb.engine.inputs.messages import normalize_messages
from mlx_nb.engine.inputs.prompts import encode_prompt, render_chat
from mlx_nb.models import load_model
from reference import greedy_alone

MAX_TOKENS = 20
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def chat(i: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(WORDS[: 1 + i % len(WORDS)]) * (1 + i // 3)}]


def prompt_tokens(loaded, messages):
    return encode_prompt(loaded.tokenizer, render_chat(loaded.tokenizer, normalize_messages(messages)), chat=True)


def expected(loaded, messages):
    eos = set(loaded.tokenizer.eos_token_ids)
    return [t for t in greedy_alone(loaded, prompt_tokens(loaded, messages), MAX_TOKENS) if t not in eos]


# Each fixture as shipped (float), and quantized so its linears run on the CPU kernels' packed
# 4/8-bit matmul (the default model's path).
CASES = [("tiny-llama", None), ("tiny-qwen3.5", None), ("tiny-gemma3", None), ("tiny-falcon-h1", None),
         ("tiny-llama", 4), ("tiny-qwen3.5", 8), ("tiny-gemma3", 4), ("tiny-falcon-h1", 8)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-q{q}" if q else n for n, q in CASES])
def model_case(request):
    name, quantize = request.param
    loaded = load_model(name, quantize=quantize)
    chats = [chat(i) for i in range(8)]
    refs = [expected(loaded, c) for c in chats]
    del loaded
    with Engine(name, quantize=quantize, max_batch=8, prefill_batch=4, prefill_step_size=16, wait=True) as engine:
        yield name, engine, chats, refs


def test_concurrent_and_late_requests_match_alone(model_case):
    name, engine, chats, refs = model_case
    first = [engine.submit(messages=c, max_tokens=MAX_TOKENS) for c in chats[:6]]
    stream = iter(first[0])
    for _ in range(3):  # the batch is decoding now
        next(stream)
    late = [engine.submit(messages=c, max_tokens=MAX_TOKENS) for c in chats[6:]]
    results = [h.result(timeout=120) for h in first + late]
    for i, (r, ref) in enumerate(zip(results, refs)):
        assert r.error is None, r.error
        assert r.token_ids == ref, f"{name}: request {i} differs from its one-at-a-time output"
    events = engine.events()
    late_ids = {h.id for h in late}
    joined = [e for e in events if e["kind"] == "extend" and set(e["requests"]) & late_ids]
    assert joined and all(e["detail"]["batch_size"] >= 2 for e in joined), "late requests did not join a running batch"
    assert any(e["kind"] == "step" and len(e["requests"]) >= 6 for e in events)


def test_abort_mid_decode_leaves_others_unchanged(model_case):
    name, engine, chats, refs = model_case
    handles = [engine.submit(messages=c, max_tokens=MAX_TOKENS) for c in chats[:3]]
    victim = handles[1]
    stream = iter(victim)
    next(stream)
    victim.abort()
    results = [h.result(timeout=120) for h in handles]
    assert results[1].finish_reason == "abort"
    assert len(results[1].token_ids) < MAX_TOKENS
    for i in (0, 2):
        assert results[i].token_ids == refs[i], f"{name}: request {i} changed when its neighbour was aborted"
    filters = [e for e in engine.events() if e["kind"] == "filter" and victim.id in e["requests"]]
    assert filters and filters[-1]["detail"]["reason"] == "abort"


def test_requests_submitted_together_are_admitted_at_one_step_or_not_at_all():
    """`submit_requests` (a route's n choices: one prompt, n rows): every row is read in the same
    prompt batch and decodes from the same step, each equal to the model alone, whatever the batch
    was doing when they came; one refused at submit queues none of them."""
    from mlx_nb.engine.submit_request import SubmitRequest
    from mlx_nb.engine.types import RequestError

    from reference import reply_tokens

    prompts = ["a prompt every choice reads, " * 3] * 4
    loaded = load_model("tiny-llama")
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, prompts[0], chat=False), 8)] * 4
    del loaded
    with Engine("tiny-llama", wait=True) as engine:
        for _ in range(3):  # whatever the engine was doing when they came
            since = engine.events()[-1]["seq"] if engine.events() else 0
            busy = engine.submit(prompt="keep the batch busy", max_tokens=24)  # a row already decoding
            handles = engine.submit_requests([SubmitRequest.of(prompt=p, max_tokens=8) for p in prompts])
            assert [h.result(timeout=120).token_ids for h in handles] == want
            busy.result(timeout=120)
            ids = {h.id for h in handles}
            steps = [set(e["requests"]) & ids for e in engine.events(since) if e["kind"] == "step"]
            assert next(s for s in steps if s) == ids  # the first step any of them is in holds all four
        since = engine.events()[-1]["seq"]
        with pytest.raises(RequestError):
            engine.submit_requests([SubmitRequest.of(prompt="fine"), SubmitRequest.of(prompt="bad", temperature=-1.0)])
        after = engine.submit(prompt="after", max_tokens=2)
        after.result(timeout=60)
        assert {r for e in engine.events(since) if e["kind"] == "insert" for r in e["requests"]} == {after.id}
