"""Memory does not grow with the number of requests served (seed 001: growth in long runs).

Each finished request's cache leaves the batch; with prefix reuse off nothing is kept, so after a
warm-up the engine's active memory must come back to the same level however many requests ran.
"""

from mlx_nb import Engine


def active_bytes(engine) -> int:
    return engine.status()["memory"]["active_bytes"]


def test_active_memory_is_flat_across_many_requests():
    with Engine("tiny-llama", prefix_cache=False, max_batch=8, wait=True) as engine:
        def wave(tag):
            handles = [engine.submit(prompt=f"{tag} {i} " * (3 + i), max_tokens=40) for i in range(8)]
            assert all(h.result(timeout=120).finish_reason in ("stop", "length") for h in handles)

        for i in range(3):  # warm-up: buffers and kernels of every shape this workload uses
            wave(f"warm{i}")
        settled = active_bytes(engine)
        for i in range(12):
            wave(f"run{i}")
        after = active_bytes(engine)
    # 96 more requests, a few thousand tokens: a leak of one cache per request would be megabytes.
    assert after <= settled + 256 * 1024, f"active memory grew from {settled} to {after} bytes"


def test_prefix_cache_holds_memory_within_its_budget():
    budget = 2 * 1024 * 1024
    with Engine("tiny-llama", prefix_cache_bytes=budget, wait=True) as engine:
        for i in range(40):  # every request stores snapshots; the budget must evict
            engine.generate(messages=[{"role": "system", "content": f"system {i} " * 20},
                                      {"role": "user", "content": "hi " * 20}], max_tokens=24)
        stats = engine.status()["prefix_cache"]
    assert 0 < stats["bytes"] <= budget and stats["stored"] > stats["entries"], stats
