"""The background lane (engine/scheduling/background.py): a dataset job's rows fill the batch slots interactive
requests leave, yield theirs to interactive rows (taken out with their cache, put back exactly where
they were), keep a minimum share under load, and several jobs take turns.

The yield is checked against the same rows run undisturbed, over every fixture family whose cache
can be cut back, with and without a schema constraint and a quantized KV cache: token for token."""

import threading
import time

import pytest

from mlx_nb import Engine
from mlx_nb.engine import SubmitRequest
from mlx_nb.engine.sampling.constrained import Constraint

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 12}},
          "required": ["ok", "name"]}


def job_rows(eng, n, job="j1", max_tokens=32, offset=0, padding=""):
    return [eng.submit(messages=[{"role": "user", "content": f"{padding}row {offset + i}: tell me about item {i * 13}"}],
                       max_tokens=max_tokens, temperature=0.0, job=job,
                       constraint=Constraint("json_schema", SCHEMA) if i % 2 else None) for i in range(n)]


def decoding(eng) -> int:
    return sum(1 for r in eng.status()["requests"] if r["phase"] == "decode")


def wait_for(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def reading(eng) -> int:
    return sum(1 for r in eng.status()["requests"] if r["phase"] == "prefill")


def run(model, interrupt, kv_bits=None, long_prompts=False):
    """Six job rows, alone or interrupted by three chats once they decode (or, with `long_prompts`,
    while they are still reading their prompts, 16 tokens a step)."""
    padding = " ".join(f"word{i}" for i in range(120)) + ". " if long_prompts else ""
    with Engine(model, max_batch=6, job_rows_under_load=1, prefix_cache=False, speculation=False, kv_bits=kv_bits,
                prefill_step_size=16 if long_prompts else 512, prefill_budget_s=None if long_prompts else 0.25,
                wait=True) as eng:
        rows = job_rows(eng, 6, padding=padding)
        chats = []
        if interrupt:
            wait_for((lambda: reading(eng) >= 3) if long_prompts else (lambda: decoding(eng) == 6))
            for k in range(3):
                chats.append(eng.submit(messages=[{"role": "user", "content": f"hello {k}"}], max_tokens=12,
                                        temperature=0.0))
                time.sleep(0.01)
        out = [(h.result().token_ids, h.result().finish_reason) for h in rows]
        for c in chats:
            assert c.result().finish_reason in ("stop", "length")
        events = eng.events()
        yields = [e for e in events if e["kind"] == "filter" and e["detail"].get("reason") == "yield"]
        if long_prompts and interrupt:  # they yielded before any of them had read its whole prompt
            ids = {h.id for h in rows}
            started = [e["seq"] for e in events if e["kind"] == "extend" and set(e["requests"]) & ids]
            assert yields and yields[0]["seq"] < min(started)
        return out, yields, eng.status()["background"]["can_yield"]


# every fixture family; those whose cache cannot be cut back by a token (a sliding window that may
# wrap, SSM state) never yield: their job rows finish where they are
FAMILIES = [("tiny-llama", None, True), ("tiny-llama", 8, True), ("tiny-qwen3-think", None, True),
            ("tiny-gemma3", None, False), ("tiny-gpt-oss", None, False), ("tiny-qwen3.5", None, False),
            ("tiny-falcon-h1", None, False)]


@pytest.mark.parametrize("model,kv_bits,yields_expected", FAMILIES)
def test_a_yielded_row_resumes_token_for_token(model, kv_bits, yields_expected):
    alone, none, _ = run(model, interrupt=False, kv_bits=kv_bits)
    interrupted, yields, can_yield = run(model, interrupt=True, kv_bits=kv_bits)
    assert not none
    assert can_yield == yields_expected
    if can_yield:  # an interactive request arriving at a full batch of job rows makes them yield
        assert sum(len(e["requests"]) for e in yields) >= 5
    else:
        assert not yields
    assert interrupted == alone


@pytest.mark.parametrize("model,kv_bits", [("tiny-llama", None), ("tiny-llama", 8), ("tiny-qwen3-think", None)])
def test_a_row_yielding_while_it_reads_its_prompt_resumes_token_for_token(model, kv_bits):
    """An interactive request arriving while a wave of job rows reads long prompts does not wait for
    the wave: the rows leave with the part of the prompt they have read and read on from there later."""
    alone, _, _ = run(model, interrupt=False, kv_bits=kv_bits, long_prompts=True)
    interrupted, yields, can_yield = run(model, interrupt=True, kv_bits=kv_bits, long_prompts=True)
    assert can_yield and sum(len(e["requests"]) for e in yields) >= 5
    assert interrupted == alone


def test_a_wave_of_job_rows_reads_its_prompts_in_paced_steps_from_the_first():
    """A chat arriving while a wave reads its prompts waits for one step, not for the whole wave's
    prompts: the wave's first step reads a part of each prompt (engine/scheduling/pacing.py), not all of it."""
    padding = " ".join(f"word{i}" for i in range(150)) + ". "
    with Engine("tiny-llama", max_batch=8, prefix_cache=False, wait=True) as eng:
        since = eng.events()[-1]["seq"] if eng.events() else 0
        rows = job_rows(eng, 8, padding=padding, max_tokens=4)
        for h in rows:
            h.result()
        firsts = {}
        for e in eng.events(since):
            if e["kind"] == "prefill":
                for rid in e["requests"]:
                    firsts.setdefault(rid, e["detail"])
        assert set(firsts) == {h.id for h in rows}
        assert all(d["done"] < d["total"] // 4 for d in firsts.values()), firsts


def test_interactive_rows_go_ahead_of_queued_job_rows_and_job_rows_yield_to_them():
    with Engine("tiny-llama", max_batch=4, job_rows_under_load=1, wait=True) as eng:
        rows = job_rows(eng, 24, max_tokens=24)
        wait_for(lambda: decoding(eng) == 4)
        since = eng.events()[-1]["seq"]
        chat = eng.submit(messages=[{"role": "user", "content": "an interactive question"}], max_tokens=8,
                          temperature=0.0)
        assert chat.result().finish_reason in ("stop", "length")
        events = eng.events(since)
        job_ids = {h.id for h in rows}
        (joined,) = [e["seq"] for e in events if e["kind"] == "insert" and e["requests"] == [chat.id]]
        yielded = [e for e in events if e["kind"] == "filter" and e["detail"].get("reason") == "yield"]
        assert yielded and yielded[0]["seq"] > joined and set(yielded[0]["requests"]) <= job_ids
        # every job row in the batch gave its slot up at once: the chat decodes alone (a short chat ends
        # before the job's minimum share is due, STARVED_S)
        steps = [e for e in events if e["kind"] == "step" and chat.id in e["requests"]]
        assert steps and all(not set(e["requests"]) & job_ids for e in steps)
        for h in rows:
            assert h.result().finish_reason in ("stop", "length")
        assert eng.status()["background"]["rows_done"] == 24


def test_a_job_completes_rows_while_eight_interactive_streams_run():
    with Engine("tiny-llama", max_batch=8, job_rows_under_load=2, wait=True) as eng:
        stop = threading.Event()
        finished = []

        def chatter(k):
            while not stop.is_set():
                eng.submit(messages=[{"role": "user", "content": f"stream {k}"}], max_tokens=48,
                           temperature=0.0).result()

        threads = [threading.Thread(target=chatter, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: decoding(eng) >= 6)
            rows = job_rows(eng, 6, max_tokens=8)
            for h in rows:
                finished.append(h.result(120).finish_reason)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert finished == ["length" if f == "length" else "stop" for f in finished] and len(finished) == 6


def test_jobs_take_turns_and_a_waiting_row_can_be_aborted():
    with Engine("tiny-llama", max_batch=2, wait=True) as eng:
        first = job_rows(eng, 8, job="a", max_tokens=6)
        second = job_rows(eng, 8, job="b", max_tokens=6, offset=100)
        status = eng.status()  # rows waiting in the lane are counted, not listed (a job may hold thousands)
        lane = status["background"]
        assert len(status["requests"]) <= 2 and lane["waiting"] + lane["in_batch"] + lane["rows_done"] == 16
        eng.abort(first[-1].id)
        assert first[-1].result(30).finish_reason == "abort"
        for h in first[:-1] + second:
            h.result(60)
        inserts = [e["detail"].get("job") for e in eng.events() if e["kind"] == "insert"]
        # job b's rows start long before job a's have all run: round robin, not first come first served
        assert "b" in inserts[: inserts.index("a", 4) + 4]
        last_a = max(i for i, j in enumerate(inserts) if j == "a")
        first_b = inserts.index("b")
        assert first_b < last_a


def test_job_rows_are_not_counted_as_a_burst_nor_in_the_interactive_latency():
    with Engine("tiny-llama", max_batch=8, wait=True) as eng:
        for h in job_rows(eng, 4, max_tokens=4):
            h.result()
        latency = eng.status()["latency"]["time_to_first_token_s"]
        assert latency["count"] == 0
        eng.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert eng.status()["latency"]["time_to_first_token_s"]["count"] == 1


def test_a_bad_share_setting_is_refused():
    with pytest.raises(ValueError, match="job_rows_under_load"):
        Engine("tiny-llama", job_rows_under_load=-1)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="job_batch must be a whole number of rows >= 1"):
            Engine("tiny-llama", job_batch=bad)


def test_a_job_holds_at_most_job_batch_rows_and_chats_still_fill_the_batch():
    """The job's rows never exceed `job_batch` in a step (its steps stay short for an arriving chat),
    while interactive requests still decode up to `max_batch` together."""
    with Engine("tiny-llama", max_batch=8, job_batch=3, wait=True) as eng:
        assert eng.status()["background"]["job_batch"] == 3
        since = eng.events()[-1]["seq"] if eng.events() else 0
        rows = job_rows(eng, 10, max_tokens=12)
        assert all(h.result().finish_reason in ("stop", "length") for h in rows)
        job_ids = {h.id for h in rows}
        widths = [len(set(e["requests"]) & job_ids) for e in eng.events(since) if e["kind"] == "step"]
        assert widths and max(widths) == 3, widths
        since = eng.events()[-1]["seq"]
        chats = eng.submit_requests([SubmitRequest.of(messages=[{"role": "user", "content": f"chat {i}"}],
                                                      max_tokens=12, temperature=0.0) for i in range(8)])
        assert all(h.result().finish_reason in ("stop", "length") for h in chats)
        assert max(e["detail"]["batch_size"] for e in eng.events(since) if e["kind"] == "step") > 3


def test_the_batch_timeline_marks_job_rows_and_their_yields():
    import re

    from mlx_nb.pictures.batch import build_batch_svg, lanes_from_events

    with Engine("tiny-llama", max_batch=4, job_rows_under_load=1, wait=True) as eng:
        rows = job_rows(eng, 4, max_tokens=32)
        wait_for(lambda: decoding(eng) == 4)
        chat = eng.submit(messages=[{"role": "user", "content": "hi <b>there</b>"}], max_tokens=16, temperature=0.0)
        chat.result()
        for h in rows:
            h.result()
        events = eng.events()
    lanes, _ = lanes_from_events(events)
    by_id = {ln["id"]: ln for ln in lanes}
    assert by_id[chat.id]["job"] is None and not by_id[chat.id]["yields"]
    yielded = [by_id[h.id] for h in rows if by_id[h.id]["yields"]]
    assert len(yielded) == 4 and all(ln["job"] == "j1" for ln in yielded)  # every job row gives its slot up
    assert all(back is not None and back >= gone for ln in yielded for gone, back in ln["yields"])
    svg = build_batch_svg(events, max_lanes=10)
    assert len(re.findall(r'<g class="lane job"', svg)) == 4 and len(re.findall(r'<g class="lane"', svg)) == 1
    assert svg.count('class="yielded"') == 4 and "job row decoding" in svg
    assert "<b>there" not in svg  # the prompt's words are escaped


def test_a_wave_waits_for_room_but_not_for_ever_and_yielded_rows_never_wait():
    from types import SimpleNamespace

    from mlx_nb.engine.scheduling.background import WAVE_WAIT_S, BackgroundLane, Parked

    lane = BackgroundLane(batch=32)
    for i in range(40):
        lane.add(SimpleNamespace(id=f"r{i}", extra={"job": "j"}, handle=SimpleNamespace(done=False)))
    assert lane.wave(32, room=5, now=100.0) == 32  # a whole batch's worth waits for room
    assert lane.wave(32, room=5, now=100.0 + WAVE_WAIT_S / 2) == 32
    assert lane.wave(32, room=5, now=100.0 + WAVE_WAIT_S) == 1  # room unused this long: fill it now
    assert lane.wave(32, room=0, now=200.0) == 32  # a full batch starts the clock again
    lane.park(Parked(SimpleNamespace(id="p", extra={"job": "j"}, handle=SimpleNamespace(done=False)), [], [1], [[2]]))
    assert lane.wave(32, room=1, now=200.0) == 1  # a yielded row comes back as soon as there is room
    assert [getattr(r, "live", r).id for r in lane.take(3)] == ["p", "r0", "r1"]
    narrow = BackgroundLane(batch=4)
    for i in range(10):
        narrow.add(SimpleNamespace(id=f"n{i}", extra={"job": "j"}, handle=SimpleNamespace(done=False)))
    assert narrow.room(interactive=0, background=1, max_batch=32, now=0.0) == 3  # job_batch, not max_batch
    assert narrow.wave(32, room=3, now=0.0) == 4
