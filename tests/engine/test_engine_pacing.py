"""Prefill pacing: a long prompt is read in chunks sized so running streams keep their pace."""

from mlx_nb import Engine
from mlx_nb.engine.scheduling.pacing import MAX_STRETCH, MIN_CHUNK, PROBE_TOKENS, PrefillPacer


def test_pacer_budgets_prompt_tokens_per_step_while_rows_decode():
    pacer = PrefillPacer(max_chunk=512, budget_s=0.25)
    assert pacer.next_chunk(5.0, 4096, decoding=0, waiting=8, rows=8) == 512  # nobody decodes: full chunks
    assert pacer.next_chunk(0.05, 0, decoding=1, waiting=1, rows=1) == PROBE_TOKENS  # a stream runs: probe
    assert pacer.next_chunk(1.0, 64, decoding=1, waiting=1, rows=1) == PROBE_TOKENS // 4  # 4x over budget
    assert pacer.next_chunk(1.0, 16, decoding=1, waiting=1, rows=1) == MIN_CHUNK  # never below the floor
    assert pacer.next_chunk(0.05, 0, decoding=1, waiting=0, rows=0) == MIN_CHUNK  # no prompt read: no signal
    assert pacer.next_chunk(0.01, 8, decoding=1, waiting=1, rows=1) == 2 * MIN_CHUNK  # grows at most 2x a step
    for _ in range(12):
        pacer.next_chunk(0.01, pacer.tokens, decoding=1, waiting=1, rows=1)
    assert pacer.chunk == 512  # but never past the most a row may read in a step


def test_pacer_splits_the_budget_among_rows_and_stretches_it_for_a_burst():
    pacer = PrefillPacer(max_chunk=512, budget_s=0.25)
    assert pacer.next_chunk(0.05, 0, decoding=2, waiting=8, rows=8) == PROBE_TOKENS // 8
    # 0.5 s for 64 tokens: over budget for 2 waiting on 2 streams, under it for 30 waiting on 2
    calm = PrefillPacer(max_chunk=512, budget_s=0.25)
    calm.next_chunk(0.05, 0, decoding=2, waiting=2, rows=2)
    assert calm.next_chunk(0.5, 64, decoding=2, waiting=2, rows=2) == 32 // 2
    burst = PrefillPacer(max_chunk=512, budget_s=0.25)
    burst.next_chunk(0.05, 0, decoding=2, waiting=30, rows=8)
    assert burst.next_chunk(0.5, 64, decoding=2, waiting=30, rows=8) == 128 // 8  # target 4 x 0.25 s
    assert MAX_STRETCH == 4.0


def test_pacer_off_always_reads_full_chunks():
    pacer = PrefillPacer(max_chunk=64, budget_s=None)
    assert pacer.next_chunk(9.0, 64, decoding=8, waiting=8, rows=8) == 64


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
    assert paced_chunks[0] == PROBE_TOKENS and set(paced_chunks[2:-1]) == {MIN_CHUNK}, paced_chunks
    assert during["prefill_chunk"] == MIN_CHUNK
    steps_during = [e for e in events if e["kind"] == "step" and runner.id in e["requests"]
                    and _between(e, events, paced.id)]
    assert len(steps_during) >= len(paced_chunks) - 1, "the running stream stalled while the prompt was read"


def _between(event, events, request_id) -> bool:
    pre = [e["seq"] for e in events if e["kind"] == "prefill" and request_id in e["requests"]]
    return pre[0] < event["seq"] < pre[-1]
