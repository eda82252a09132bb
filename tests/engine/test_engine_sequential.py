"""The sequential lane (engine/scheduling/sequential.py) behind the engine's usual interface: requests queue,
run one at a time through mlx_lm's generate_step, stream, stop, report logprobs, abort (queued or
running), and fail alone; compared with generate_step run alone, never with the engine itself.

tiny-llama batches; forcing it into the lane tests the lane on the model the batch tests use.
"""

import threading

import pytest

from mlx_nb import Engine
from mlx_nb.api.constraint_fields import constraint_of
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.models import load_model
from reference import reply_tokens

MODEL = "tiny-llama"
PROMPTS = ["a", "a much longer prompt than the others, " * 6, "one of middle length", "x y z"]
LONG = "a prompt longer than one of generate_step's prefill chunks (2048 tokens) " * 30


@pytest.fixture(scope="module")
def want():
    loaded = load_model(MODEL)
    return [reply_tokens(loaded, encode_prompt(loaded.tokenizer, p, chat=False), 10) for p in PROMPTS]


@pytest.fixture(scope="module")
def engine():
    # a small prefill chunk for the batch: the lane reads generate_step's own chunks whatever it is
    with Engine(MODEL, batch_policy="sequential", prefill_step_size=16, prefix_cache=True, wait=True) as eng:
        yield eng


def test_requests_queue_and_each_equals_generate_step_alone(engine, want):
    assert engine.status()["policy"]["mode"] == "sequential"
    assert not engine.status()["prefix_cache"]["enabled"]  # every request starts from an empty cache
    first_seq = engine.events()[-1]["seq"] if engine.events() else 0
    handles = [engine.submit(prompt=p, max_tokens=10) for p in PROMPTS]
    phases = [r["phase"] for r in engine.status()["requests"]]
    results = [h.result(timeout=120) for h in handles]
    assert [r.token_ids for r in results] == want
    assert phases.count("decode") + phases.count("prefill") <= 1  # the others wait their turn
    events = [e for e in engine.events() if e["seq"] > first_seq]
    assert [e["kind"] for e in events if e["kind"] in ("extend", "filter")] == ["extend", "filter"] * len(PROMPTS)
    assert all(e["detail"]["batch_size"] == 1 for e in events if e["kind"] == "step")


def test_a_long_prompt_is_read_in_generate_steps_chunks(engine):
    loaded_tokens = encode_prompt(engine.loaded.tokenizer, LONG, chat=False)
    assert len(loaded_tokens) > 2049
    since = engine.events()[-1]["seq"]
    eos = engine.loaded.tokenizer.eos_token_ids
    handle = engine.submit(prompt=LONG, max_tokens=3, logit_bias={t: -100 for t in eos})
    result = handle.result(timeout=120)
    assert result.finish_reason == "length" and result.usage.prompt_tokens == len(loaded_tokens)
    reads = [e["detail"]["done"] for e in engine.events(since) if e["kind"] == "prefill" and handle.id in e["requests"]]
    assert reads[:1] == [2048]  # generate_step's chunk, then the rest in the step that gives the first token


def test_a_stream_arrives_token_by_token(engine, want):
    handle = engine.submit(prompt=PROMPTS[2], max_tokens=10)
    deltas = list(handle)
    assert [t for d in deltas for t in d.token_ids] == want[2]
    assert len([d for d in deltas if d.token_ids]) == len(want[2])


def test_abort_a_queued_and_the_running_request(engine, want):
    eos = engine.loaded.tokenizer.eos_token_ids
    running = engine.submit(prompt=PROMPTS[0], max_tokens=500, logit_bias={t: -100 for t in eos})
    queued = engine.submit(prompt=PROMPTS[1], max_tokens=10)
    after = engine.submit(prompt=PROMPTS[2], max_tokens=10)
    next(iter(running))  # it decodes
    queued.abort()
    running.abort()
    assert running.result(timeout=60).finish_reason == "abort"
    assert queued.result(timeout=60).finish_reason == "abort"
    assert after.result(timeout=60).token_ids == want[2]
    assert engine.status()["requests"] == []


def test_a_failing_logits_processor_fails_its_own_request_only(engine, want):
    def broken(tokens, logits):
        raise RuntimeError("nope")

    bad = engine.submit(prompt=PROMPTS[0], max_tokens=10, logits_processors=[broken])
    good = engine.submit(prompt=PROMPTS[3], max_tokens=10)
    result = bad.result(timeout=60)
    assert result.finish_reason == "error" and "nope" in result.error
    assert good.result(timeout=60).token_ids == want[3]


def test_processors_see_the_whole_prompt_and_logprobs_come_back(engine, want):
    seen = []

    def spy(tokens, logits):
        seen.append(len(tokens))
        return logits

    prompt = encode_prompt(engine.loaded.tokenizer, PROMPTS[1], chat=False)
    result = engine.submit(prompt=PROMPTS[1], max_tokens=4, logits_processors=[spy], logprobs=3).result(timeout=60)
    assert result.token_ids == want[1][:4]
    assert seen[:2] == [len(prompt), len(prompt) + 1]  # as BatchGenerator gives them: prompt + generated
    assert [len(lp.top) for lp in result.logprobs] == [3] * 4
    assert all(lp.logprob <= 0 for lp in result.logprobs)


def test_stop_strings_end_a_request_in_the_lane(engine):
    """A processor makes the model write "hello world, again"; the stop string cuts it."""
    import mlx.core as mx

    tok = engine.loaded.tokenizer
    prompt = encode_prompt(tok, PROMPTS[3], chat=False)
    script = tok.encode("hello world, again", add_special_tokens=False)

    def force(tokens, logits):
        i = min(len(tokens) - len(prompt), len(script) - 1)
        return mx.where(mx.arange(logits.shape[-1]) == script[i], 100.0, -100.0)[None].astype(logits.dtype)

    result = engine.submit(prompt=PROMPTS[3], max_tokens=30, stop=["wor"], logits_processors=[force]).result(timeout=60)
    assert (result.finish_reason, result.text) == ("stop", "hello ")


def test_cache_layout_of_the_running_request(engine):
    eos = engine.loaded.tokenizer.eos_token_ids
    handle = engine.submit(prompt=PROMPTS[2], max_tokens=200, logit_bias={t: -100 for t in eos})
    stream = iter(handle)
    next(stream)
    layout = engine.cache_layout(handle.id)
    handle.abort()
    assert layout["request"] == handle.id and len(layout["layers"]) == len(engine.loaded.make_cache())
    assert all(layer["type"] == "KVCache" and layer["offset"] > 0 for layer in layout["layers"])


def test_many_threads_submitting_at_once(engine, want):
    out = {}

    def ask(i):
        out[i] = engine.submit(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=10).result(timeout=120).token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [out[i] for i in range(8)] == [want[i % len(PROMPTS)] for i in range(8)]


def test_the_batch_view_shows_the_queue(engine, want):
    """The batch visualizer's lanes, from the lane's events: each request waits (insert -> join)
    until the one before it has left, and the batch size never exceeds one."""
    from mlx_nb.pictures.batch import lanes_from_events

    since = engine.events()[-1]["seq"]
    handles = [engine.submit(prompt=p, max_tokens=10) for p in PROMPTS]
    for h in handles:
        h.result(timeout=120)
    lanes, sizes = lanes_from_events(engine.events(since))
    by_id = {ln["id"]: ln for ln in lanes}
    order = [by_id[h.id] for h in handles]
    assert all(ln["insert"] <= ln["join"] <= ln["leave"] for ln in order)
    assert all(b["join"] >= a["leave"] for a, b in zip(order, order[1:]))
    assert order[-1]["join"] > order[-1]["insert"]  # the last one visibly waited
    assert max(n for _, n in sizes) == 1


def test_a_constrained_request_in_the_lane(engine):
    import json

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    for seed in range(3):
        result = engine.submit(prompt=PROMPTS[1], max_tokens=40, temperature=1.0, seed=seed,
                               constraint=constraint_of(fmt)).result(timeout=60)
        assert result.finish_reason == "stop" and 0 <= json.loads(result.text)["n"] <= 99
