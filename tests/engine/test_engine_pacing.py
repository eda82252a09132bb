"""Prefill pacing: a long prompt is read in chunks sized so running streams keep their pace."""

from mlx_nb import Engine
from mlx_nb.engine.pacing import MIN_CHUNK, PROBE_CHUNK, PrefillPacer


def test_pacer_shrinks_while_rows_decode_and_reads_full_chunks_otherwise():
    pacer = PrefillPacer(max_chunk=512, budget_s=0.25)
    assert pacer.next_chunk(step_s=5.0, read_prompt=True, decoding=0) == 512  # nobody waits: full chunks
    assert pacer.next_chunk(step_s=0.05, read_prompt=False, decoding=1) == PROBE_CHUNK  # a stream runs: probe
    assert pacer.next_chunk(step_s=1.0, read_prompt=True, decoding=3) == PROBE_CHUNK // 4  # 4x over budget
    assert pacer.next_chunk(step_s=1.0, read_prompt=True, decoding=3) == MIN_CHUNK  # never below
    assert pacer.next_chunk(step_s=0.05, read_prompt=False, decoding=3) == MIN_CHUNK  # no prompt read: no signal
    assert pacer.next_chunk(step_s=0.01, read_prompt=True, decoding=3) == 2 * MIN_CHUNK  # grows at most 2x a step
    for _ in range(10):
        pacer.next_chunk(step_s=0.01, read_prompt=True, decoding=3)
    assert pacer.chunk == 512  # but never past the most a step may read


def test_pacer_off_always_reads_full_chunks():
    pacer = PrefillPacer(max_chunk=64, budget_s=None)
    assert pacer.next_chunk(step_s=9.0, read_prompt=True, decoding=8) == 64


def _chunks(events, request_id):
    done = [e["detail"]["done"] for e in events if e["kind"] == "prefill" and request_id in e["requests"]]
    return [b - a for a, b in zip([0, *done], done)]


def test_long_prompt_is_read_in_small_chunks_only_while_a_stream_decodes():
    long_prompt = "lorem ipsum dolor " * 150
    # A budget no step can meet: while a stream decodes, chunks shrink to the minimum.
    with Engine("tiny-llama", prefill_step_size=256, prefill_budget_s=1e-6, prefix_cache=False, wait=True) as engine:
        alone = engine.submit(prompt=long_prompt, max_tokens=2)
        alone.result(timeout=120)
        runner = engine.submit(prompt="go", max_tokens=2000)
        next(iter(runner))
        paced = engine.submit(prompt=long_prompt, max_tokens=2)
        paced.result(timeout=120)
        during = engine.status()
        runner.abort()
        runner.result(timeout=60)
        events = engine.events()
    alone_chunks, paced_chunks = _chunks(events, alone.id), _chunks(events, paced.id)
    assert max(alone_chunks) == 256, f"nothing was decoding, yet the prompt was read in {alone_chunks}"
    # A probe first, then 4x smaller per step down to the floor (the last chunk is whatever is left).
    assert paced_chunks[0] == PROBE_CHUNK and set(paced_chunks[2:-1]) == {MIN_CHUNK}, paced_chunks
    assert during["prefill_chunk"] == MIN_CHUNK
    steps_during = [e for e in events if e["kind"] == "step" and runner.id in e["requests"]
                    and _between(e, events, paced.id)]
    assert len(steps_during) >= len(paced_chunks) - 1, "the running stream stalled while the prompt was read"


def _between(event, events, request_id) -> bool:
    pre = [e["seq"] for e in events if e["kind"] == "prefill" and request_id in e["requests"]]
    return pre[0] < event["seq"] < pre[-1]
