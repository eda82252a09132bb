"""An idle engine holds its first submit for the rest of a burst only when the traffic comes in
bursts: one chat at a time starts at once. (Orderings with wide margins, no wall-clock asserts.)"""

import time

from mlx_nb import Engine
from mlx_nb.engine.scheduling import loop


def prefill_step(engine, handle) -> int:
    return next(e["step"] for e in engine.events() if e["kind"] == "prefill" and handle.id in e["requests"])


def two_apart(engine, gap_s: float):
    """Two requests reaching an idle engine gap_s apart; finished."""
    first = engine.submit(prompt="The first request", max_tokens=4)
    time.sleep(gap_s)
    second = engine.submit(prompt="The second request", max_tokens=4)
    first.result(timeout=60), second.result(timeout=60)
    return first, second


def test_bursty_traffic_is_read_as_one_prompt_batch_and_lone_chats_are_not_held(monkeypatch):
    monkeypatch.setattr(loop, "BURST_GAP_S", 2.0)
    monkeypatch.setattr(loop, "BURST_MAX_S", 4.0)
    with Engine("tiny-llama", prefix_cache=False, wait=True) as engine:
        engine.submit(prompt="a lone chat", max_tokens=2).result(timeout=60)
        first, second = two_apart(engine, 0.5)  # after a lone chat: the first starts at once
        assert prefill_step(engine, first) < prefill_step(engine, second)
        burst = [engine.submit(prompt=f"burst {i}", max_tokens=2) for i in range(4)]
        [h.result(timeout=60) for h in burst]
        first, second = two_apart(engine, 0.5)  # after a burst: the first waits for the second
        assert prefill_step(engine, first) == prefill_step(engine, second)
        engine.submit(prompt="a lone chat", max_tokens=2).result(timeout=60)  # held for one gap, then served
        first, second = two_apart(engine, 0.5)
        assert prefill_step(engine, first) < prefill_step(engine, second)
