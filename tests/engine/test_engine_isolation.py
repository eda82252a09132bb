"""A failing request fails alone; a failing step fails its batch, never the engine."""

import pytest

from mlx_nb.engine.types import RequestError


def boom(tokens, logits):
    raise ValueError("deliberate failure")


def wrong_shape(tokens, logits):
    import mlx.core as mx

    return mx.zeros((3, 3))  # would break the batched concatenate inside the step


def wrong_dtype(tokens, logits):
    import mlx.core as mx

    return mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32) * mx.ones(logits.shape, dtype=mx.int32)


def sampler_raises(logprobs):
    raise RuntimeError("sampler exploded")


def sampler_wrong_shape(logprobs):
    import mlx.core as mx

    return mx.zeros((5,), dtype=mx.uint32)


def sampler_floats(logprobs):
    return logprobs[:, :1].squeeze(-1)


def after_three_tokens(fn, processor=True):
    """`fn` from the 4th call on, so the failing request is decoding in the batch when it fails."""
    import mlx.core as mx

    calls = []

    def processor_fn(tokens, logits):
        calls.append(1)
        return fn(tokens, logits) if len(calls) > 3 else logits

    def sampler_fn(logprobs):
        calls.append(1)
        return fn(logprobs) if len(calls) > 3 else mx.argmax(logprobs, axis=-1)

    return processor_fn if processor else sampler_fn


FAILURES = {
    "processor raises": (lambda: dict(logits_processors=[after_three_tokens(boom)]), "deliberate failure"),
    "processor wrong shape": (lambda: dict(logits_processors=[after_three_tokens(wrong_shape)]),
                              "expected an array of shape"),
    "processor wrong dtype": (lambda: dict(logits_processors=[after_three_tokens(wrong_dtype)]), "floating point"),
    "sampler raises": (lambda: dict(sampler=after_three_tokens(sampler_raises, False)), "sampler exploded"),
    "sampler wrong shape": (lambda: dict(sampler=after_three_tokens(sampler_wrong_shape, False)),
                            "expected token ids of shape"),
    "sampler wrong dtype": (lambda: dict(sampler=after_three_tokens(sampler_floats, False)), "integer token ids"),
}
PROMPTS = [f"p{i} " * (i + 1) for i in range(8)]


@pytest.fixture(scope="module")
def alone(llama_engine):
    """Each prompt decoded alone by mlx_lm's generate_step (run on the engine thread, between steps)."""
    from mlx_nb.engine.inputs.prompts import encode_prompt
    from reference import greedy_alone

    loaded = llama_engine.loaded
    return [llama_engine._call(lambda p=p: greedy_alone(loaded, encode_prompt(loaded.tokenizer, p, chat=False), 12))
            for p in PROMPTS]


@pytest.mark.parametrize("failure", list(FAILURES))
def test_one_failing_request_in_a_batch_of_eight_ends_alone(llama_engine, alone, failure):
    make_kwargs, message = FAILURES[failure]
    handles = [llama_engine.submit(prompt=p, max_tokens=12, **(make_kwargs() if i == 3 else {}))
               for i, p in enumerate(PROMPTS)]
    results = [h.result(timeout=60) for h in handles]
    assert results[3].finish_reason == "error" and message in results[3].error, results[3].error
    assert results[3].token_ids == alone[3][: len(results[3].token_ids)] and len(results[3].token_ids) >= 2
    for i, r in enumerate(results):
        if i != 3:
            assert r.finish_reason == "length" and r.token_ids == alone[i], f"row {i} changed"
    steps = [e for e in llama_engine.events() if e["kind"] == "step" and handles[3].id in e["requests"]]
    assert steps and max(len(e["requests"]) for e in steps) >= 4, "the failing request never shared a batch"
    assert llama_engine.submit(prompt="still here", max_tokens=3).result().finish_reason == "length"


class FailingOnce:
    """Stands in for the runner's BatchGenerator for one step: an unexpected upstream failure."""

    def __init__(self, generator):
        self.generator = generator
        self.failed = False

    def next(self):
        if not self.failed:
            self.failed = True
            raise RuntimeError("unexpected failure inside a step")
        return self.generator.next()

    def __getattr__(self, name):
        return getattr(self.generator, name)


def test_a_step_that_raises_fails_its_batch_and_the_engine_goes_on(llama_engine):
    runner = llama_engine._loop.runner
    llama_engine._call(lambda: setattr(runner, "_bg", FailingOnce(runner._bg)))
    bad = llama_engine.submit(prompt="x", max_tokens=8)
    r = bad.result(timeout=60)
    assert r.finish_reason == "error" and "batch step failed" in r.error
    assert any(e["kind"] == "error" for e in llama_engine.events())
    after = llama_engine.submit(prompt="hello", max_tokens=4).result(timeout=60)
    assert after.finish_reason == "length" and len(after.token_ids) == 4


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"logprobs": 99}, "logprobs"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_is_refused_at_submit_naming_the_field(llama_engine, kwargs, field):
    with pytest.raises(RequestError) as err:
        llama_engine.submit(prompt="x", **kwargs)
    assert err.value.field == field


def test_budget_beyond_the_context_is_clamped_and_none_means_the_rest(llama_engine):
    """What clients send (Claude Code: 32000) is clamped to what fits after the prompt, not refused;
    the handle says what was granted and how long the prompt is, before any token."""
    context = llama_engine.loaded.context_length
    messages = [{"role": "user", "content": "hello there"}]
    for asked in (10**7, None):
        handle = llama_engine.submit(messages=messages, max_tokens=asked)
        assert handle.prompt_tokens > 0 and handle.max_tokens == context - handle.prompt_tokens
        handle.abort()
    small = llama_engine.submit(messages=messages, max_tokens=3)
    assert small.max_tokens == 3 and small.result(timeout=60).usage.prompt_tokens == small.prompt_tokens


def test_count_tokens_is_the_chat_templates_length(llama_engine):
    """Compared with the tokenizer's own apply_chat_template (mlx_lm's wrapper around transformers);
    tiny-llama's template renders no tools, so they are in the conversation it is given (generic format)."""
    from mlx_nb.engine.inputs.generic_tools import inline_tools

    tok = llama_engine.loaded.tokenizer
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for messages in ([{"role": "user", "content": "hi"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a " * 50}]):
        want = len(tok.apply_chat_template(inline_tools(messages, tools), add_generation_prompt=True))
        assert want > len(tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True)) + 100
        assert llama_engine.count_tokens(messages=messages, tools=tools) == want
        assert llama_engine.submit(messages=messages, tools=tools, max_tokens=1).prompt_tokens == want


def test_prompt_longer_than_the_context_is_refused(llama_engine):
    with pytest.raises(RequestError, match="shorten"):
        llama_engine.submit(prompt="word " * 5000, max_tokens=4)


def test_template_error_is_a_request_error():
    from mlx_nb import Engine

    with Engine("tiny-qwen3.5", wait=True) as eng:
        call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
        with pytest.raises(RequestError, match="chat template rejected.*alternate"):
            eng.submit(messages=[{"role": "user", "content": "u"},
                                 {"role": "assistant", "content": None, "tool_calls": [call]},
                                 {"role": "assistant", "content": None, "tool_calls": [call]}])
        with pytest.raises(RequestError, match="text-only"):
            eng.submit(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
        ok = eng.submit(messages=[{"role": "system", "content": "s"}, {"role": "system", "content": "t"},
                                  {"role": "user", "content": "u"}, {"role": "user", "content": "v"}], max_tokens=3)
        assert ok.result().finish_reason in ("length", "stop")


def test_logprobs_top_k(llama_engine):
    r = llama_engine.submit(prompt="hello", max_tokens=3, logprobs=4).result()
    assert len(r.logprobs) == 3
    for lp in r.logprobs:
        assert len(lp.top) == 4
        assert lp.top[0][1] >= lp.top[-1][1]
        assert abs(lp.logprob - lp.top[0][1]) < 1e-5  # greedy picks the most likely token


def test_a_submit_racing_with_close_ends_instead_of_hanging():
    from mlx_nb import Engine
    from mlx_nb.engine import EngineClosedError

    engine = Engine("tiny-llama", wait=True)
    loaded = engine.loaded
    engine._loop.commands.put(("close",))  # the engine thread stops without close() marking it closed,
    engine._job.join(30)  # as when a submit passes its checks just before another thread closes
    with pytest.raises(EngineClosedError, match="create a new Engine"):
        engine.submit(prompt="late", max_tokens=4)
    # a submit that read the model before the thread stopped is ended, not queued forever
    from mlx_nb.engine.handle import RequestHandle
    from mlx_nb.engine.scheduling.live import LiveRequest
    from mlx_nb.engine.text.textstream import TextStream
    from mlx_nb.engine.types import Request

    live = LiveRequest(Request("late"), RequestHandle("late", engine.abort), [1, 2], TextStream(loaded.tokenizer, []))
    engine._loop.submit(live)
    result = live.handle.result(timeout=30)
    assert result.finish_reason == "abort" and "closed" in result.error
    engine.close()
