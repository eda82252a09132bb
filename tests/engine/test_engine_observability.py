"""What status(), cache_layout() and events() report: what the widgets and routes draw from."""

import time

from mlx_nb import Engine
from held import held


def test_status_reports_each_request_and_the_engine(llama_engine):
    handle = llama_engine.submit(prompt="tell me more " * 5, max_tokens=200)
    it = iter(handle)
    for _ in range(3):
        next(it)
    status = llama_engine.status()
    mine = next(r for r in status["requests"] if r["id"] == handle.id)
    assert mine["phase"] == "decode" and mine["prompt_tokens"] > 10 and mine["generated_tokens"] >= 3
    assert mine["prefilled_tokens"] == mine["prompt_tokens"] and mine["max_tokens"] == 200
    assert mine["ttft_s"] > 0 and mine["tokens_per_s"] > 0 and mine["images"] == 0
    assert status["ready"] and status["kind"] == "text" and status["batch_size"] >= 1
    assert status["steps"] > 0 and status["generated_tokens"] >= 3 and status["queue_length"] == 0
    assert status["memory"]["active_bytes"] > 0 and status["memory"]["peak_bytes"] >= status["memory"]["active_bytes"]
    assert "blas" in status["runtime"] and status["options"]["max_batch"] == 16
    handle.abort()
    assert handle.result(timeout=60).finish_reason == "abort"
    assert handle.id not in [r["id"] for r in llama_engine.status()["requests"]]


def test_a_long_prompt_shows_prefill_progress():
    with Engine("tiny-llama", prefill_step_size=16, prefix_cache=False, wait=True) as engine:
        handle = engine.submit(prompt="lorem ipsum " * 300, max_tokens=2)
        seen = []
        while not handle.done:
            mine = [r for r in engine.status()["requests"] if r["id"] == handle.id]
            if mine and mine[0]["phase"] == "prefill":
                seen.append((mine[0]["prefilled_tokens"], mine[0]["prompt_tokens"]))
            time.sleep(0.005)
    assert seen, "the request was never seen prefilling"
    assert all(0 < done < total for done, total in seen) and seen == sorted(seen)


def test_cache_layout_of_a_hybrid_cache_list_model_and_of_a_live_request():
    with Engine("tiny-falcon-h1", wait=True) as engine:
        model = engine.cache_layout()
        assert [m["type"] for m in model["layers"][0]["members"]] == ["ArraysCache", "KVCache"]
        assert model["layers"][0]["type"] == "CacheList" and model["layers"][0]["trimmable"] is False
        handle = engine.submit(prompt="the same words again " * 3, max_tokens=300)
        it = iter(handle)
        for _ in range(4):
            next(it)
        live = engine.cache_layout(handle.id)
        handle.abort()
    assert live["request"] == handle.id and len(live["layers"]) == len(model["layers"])
    ssm, kv = live["layers"][0]["members"]
    assert kv["type"] == "KVCache" and kv["offset"] > 12 and kv["dtype"] == "float32" and kv["trimmable"]
    assert kv["shapes"][0][2] == kv["offset"] and kv["nbytes"] > 0  # keys: (1, heads, tokens, head_dim)
    assert ssm["type"] == "ArraysCache" and ssm["nbytes"] > 0 and not ssm["trimmable"]


def test_events_are_a_bounded_ring_with_increasing_sequence_numbers():
    with Engine("tiny-llama", event_capacity=20, wait=True) as engine:
        engine.generate(prompt="count", max_tokens=40)
        events = engine.events()
    assert len(events) == 20
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and seqs[0] > 20, "the oldest events were not the ones dropped"
    assert events[-1]["kind"] == "filter" and events[-1]["detail"]["reason"] == "length"


def test_max_batch_bounds_the_decode_batch_whatever_the_prefill_batch():
    with Engine("tiny-llama", max_batch=4, prefill_batch=32, wait=True) as engine:
        with held(engine):  # eight at one step: four start, four wait for room
            handles = [engine.submit(prompt=f"request {i}", max_tokens=12) for i in range(8)]
        assert all(h.result(timeout=120).finish_reason in ("stop", "length") for h in handles)
        status = engine.status()
    assert status["prefill_batch"] == 4 and status["peak_batch_size"] == 4


def test_max_batch_holds_when_requests_arrive_over_several_steps():
    """Rows still in the prompt batch count against max_batch: requests arriving while others
    prefill and finish at different steps once grew a max_batch-2 decode batch to 3."""
    import random
    import time

    rng = random.Random(3)
    with Engine("tiny-llama", max_batch=2, prefill_batch=32, prefix_cache=False, wait=True) as engine:
        eos = {t: -100 for t in engine.loaded.tokenizer.eos_token_ids}
        handles = []
        with held(engine):  # the first two at one step: the batch reaches its bound at once
            handles += [engine.submit(prompt=f"first {i}", max_tokens=9, logit_bias=eos) for i in range(2)]
        for i in range(24):
            handles.append(engine.submit(prompt=f"request {i} " * rng.randint(1, 5), max_tokens=rng.randint(2, 9),
                                         logit_bias=eos))
            time.sleep(rng.random() * 0.01)
        assert all(h.result(timeout=120).finish_reason == "length" for h in handles)
        sizes = [e["detail"]["batch_size"] for e in engine.events() if "batch_size" in e["detail"]]
        assert engine.status()["peak_batch_size"] == 2 and max(sizes) == 2, sizes
