"""A vision prefill is paced like a text prefill: read in chunks between batch steps.

While a vision request with a large image is prefilled, a running text stream keeps producing
tokens (its decode steps interleave with the vision request's prefill chunks), status() answers
mid-prefill with the progress, and aborting the vision request mid-prefill frees it within one
chunk. The tests assert the ORDER of events, never times.
"""

import mlx.core as mx
import pytest

from mlx_nb import Engine
from vision_reference import picture

NAME = "tiny-qwen3-vl"
LARGE = picture(224, 224, 9)  # 64 image tokens, read 8 at a time
QUESTION = [{"role": "user", "content": [{"type": "image", "image": LARGE}, {"type": "text", "text": "Describe it."}]}]
STORY = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def engine():
    with Engine(NAME, max_batch=8, prefill_step_size=8, wait=True) as eng:
        yield eng


def endless(engine):
    """A logits processor that bans EOS, so the text stream runs until its token budget."""
    eos = engine.loaded.tokenizer.eos_token_ids

    def no_eos(tokens, logits):
        banned = mx.zeros(logits.shape[-1], dtype=mx.bool_)
        for t in eos:
            banned = banned | (mx.arange(logits.shape[-1]) == t)
        return mx.where(banned[None], -1e9, logits)

    return [no_eos]


def vision_chunks(events, rid):
    return [e for e in events if e["kind"] == "prefill" and rid in e["requests"]]


def test_running_stream_decodes_between_the_chunks_of_a_vision_prefill(engine):
    seen = []  # (event, the vision request's status entry when the event was published)

    def watch(event):  # runs on the engine thread, between steps: status() is answered in place
        if event.kind == "prefill" and vision_id and vision_id[0] in event.requests:
            entry = next((r for r in engine.status()["requests"] if r["id"] == vision_id[0]), None)
            seen.append((event.detail, entry))

    vision_id = []
    unsubscribe = engine.subscribe(watch)
    story = engine.submit(messages=STORY, max_tokens=120, logits_processors=endless(engine))
    next(iter(story))  # the text stream is decoding
    question = engine.submit(messages=QUESTION, max_tokens=4)
    vision_id.append(question.id)
    result = question.result(timeout=120)
    unsubscribe()
    story.abort()
    story.result(timeout=60)
    assert result.error is None and result.finish_reason in ("length", "stop")

    events = [e for e in engine.events() if question.id in e["requests"] or story.id in e["requests"]]
    chunks = vision_chunks(events, question.id)
    reads = [c["detail"]["done"] for c in chunks]
    assert len(chunks) >= 8 and reads == sorted(reads) and reads[-1] == chunks[-1]["detail"]["total"]
    assert reads[-1] >= 64, "the large image's tokens were not all read"
    assert max(b - a for a, b in zip(reads, reads[1:])) <= 8, "a chunk read more than the chunk size"
    # Between the first and the last chunk, the text stream took a decode step after every chunk.
    first, last = events.index(chunks[0]), events.index(chunks[-1])
    window = events[first:last + 1]
    story_steps = [i for i, e in enumerate(window) if e["kind"] == "step" and story.id in e["requests"]]
    assert len(story_steps) >= len(chunks) - 1, [(e["kind"], e["requests"]) for e in window]
    for a, b in zip(chunks, chunks[1:]):
        between = events[events.index(a):events.index(b)]
        assert any(e["kind"] == "step" and story.id in e["requests"] for e in between)
    # status() answered mid-prefill, with the progress the events publish
    mid = [(d, entry) for d, entry in seen if 0 < d["done"] < d["total"]]
    assert mid, "no status during the prefill"
    for detail, entry in mid:
        assert entry["phase"] == "prefill" and entry["prefilled_tokens"] == detail["done"]


def test_abort_mid_prefill_frees_the_request_within_one_chunk(engine):
    aborted_at = []

    def watch(event):
        if event.kind == "prefill" and vision_id and vision_id[0] in event.requests and event.detail["done"] > 0:
            if not aborted_at:
                aborted_at.append(event.seq)
                engine.abort(vision_id[0])  # queued now, handled before the next engine iteration

    vision_id = []
    unsubscribe = engine.subscribe(watch)
    story = engine.submit(messages=STORY, max_tokens=60, logits_processors=endless(engine))
    next(iter(story))
    question = engine.submit(messages=QUESTION, max_tokens=4)
    vision_id.append(question.id)
    result = question.result(timeout=120)
    unsubscribe()
    assert result.finish_reason == "abort" and result.token_ids == []
    after = [e for e in engine.events(since=aborted_at[0]) if question.id in e["requests"]]
    assert [e["kind"] for e in after][:2] in (["filter"], ["prefill", "filter"]), after
    assert after[[e["kind"] for e in after].index("filter")]["detail"]["reason"] == "abort"
    assert all(r["id"] != question.id for r in engine.status()["requests"])
    assert story.result(timeout=120).finish_reason == "length", "the running stream was disturbed"
