"""`/mlx/v1/metrics`: scraped while 32 streams decode at once, it parses as Prometheus text
(prometheus_client's own parser), its counters agree with what the clients counted, its latency
histograms hold one first-token sample per request and one gap per later token, and it is behind
the mlx API key unless the operator opens it."""

import asyncio
import threading

import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from live_server import serving

MODEL = "tiny-llama"
STREAMS = 32


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("metrics"), MODEL) as server:
        yield server


def scrape(live, client=None) -> dict:
    """{(metric sample name, frozenset of labels): value} of one scrape."""
    r = (client or live.http).get(f"{live.url}/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    labels = {"model": MODEL, **labels}
    return samples.get((name, frozenset(labels.items())), 0.0)


async def _streams(live, n: int) -> list:
    client = AsyncOpenAI(base_url=live.url, api_key=live.key, max_retries=0)

    async def one(i: int):
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i}, number {i * 7}."}],
            max_tokens=8 + i % 9, temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def test_a_scrape_during_concurrent_streams_agrees_with_the_clients(live):
    before = scrape(live)
    scrapes, done = [], threading.Event()

    def keep_scraping():
        with live.client(Authorization=f"Bearer {live.key}") as http:
            while not done.is_set():
                scrapes.append(scrape(live, http))

    scraper = threading.Thread(target=keep_scraping)
    scraper.start()
    try:
        usages = asyncio.run(_streams(live, STREAMS))
    finally:
        done.set()
        scraper.join(60)
    after = scrape(live)
    assert scrapes, "no scrape finished while the streams ran"

    generated = sum(u.completion_tokens for u in usages)
    # prompt tokens read: a stream that started after another finished may find part of its prompt
    # in the prefix cache, and the clients' usage says how much (cached_tokens)
    read = sum(u.prompt_tokens - u.prompt_tokens_details.cached_tokens for u in usages)
    assert value(after, "mlx_generation_tokens_total") - value(before, "mlx_generation_tokens_total") == generated
    assert value(after, "mlx_prompt_tokens_total") - value(before, "mlx_prompt_tokens_total") == read
    ok = ("mlx_requests_total", dict(route="chat/completions", outcome="ok"))
    assert value(after, ok[0], **ok[1]) - value(before, ok[0], **ok[1]) == STREAMS

    def count(samples, name):
        return value(samples, f"{name}_count")

    ttft, itl = "mlx_time_to_first_token_seconds", "mlx_inter_token_latency_seconds"
    assert count(after, ttft) - count(before, ttft) == STREAMS  # one first token each
    assert count(after, itl) - count(before, itl) == generated - STREAMS  # one gap per later token
    assert value(after, f"{ttft}_bucket", le="+Inf") == count(after, ttft)
    assert value(after, f"{ttft}_sum") > value(before, f"{ttft}_sum")

    # Every counter only grows from scrape to scrape, and a scrape saw the batch hold several rows.
    for name in ("mlx_generation_tokens_total", "mlx_prompt_tokens_total", "mlx_steps_total"):
        seen = [value(s, name) for s in [before, *scrapes, after]]
        assert seen == sorted(seen), name
    assert max(value(s, "mlx_batch_size") for s in scrapes) > 1
    assert value(after, "mlx_model_ready") == 1
    assert value(after, "mlx_memory_bytes", kind="weights") > 0


def test_prompt_tokens_count_what_was_read_not_what_the_prefix_cache_held(live):
    """`mlx_prompt_tokens_total` counts prompt tokens read: a chat sent again finds its prompt in the
    prefix cache, and only what the cache did not hold is counted (the usage's cached_tokens)."""
    messages = [{"role": "user", "content": "Say something about the counters, once and again."}]
    held = []
    for _ in range(2):
        before = scrape(live)
        r = live.http.post(f"{live.url}/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4})
        assert r.status_code == 200
        usage = r.json()["usage"]
        held.append(usage["prompt_tokens_details"]["cached_tokens"])
        read = value(scrape(live), "mlx_prompt_tokens_total") - value(before, "mlx_prompt_tokens_total")
        assert read == usage["prompt_tokens"] - held[-1], usage
    assert held[1] > held[0]  # the second time, the cache held (nearly) the whole prompt


def test_a_client_mistake_is_counted_as_one(live):
    before = scrape(live)
    r = live.http.post(f"{live.url}/chat/completions", json={"model": MODEL, "messages": "not a list"})
    assert r.status_code == 400
    after = scrape(live)
    key = dict(route="chat/completions", outcome="client_error")
    assert value(after, "mlx_requests_total", **key) - value(before, "mlx_requests_total", **key) == 1
    assert value(after, "mlx_requests_total", route="metrics", outcome="ok") == 0  # scrapes are not requests


def test_metrics_need_the_key(live):
    with live.client() as anonymous:
        r = anonymous.get(f"{live.url}/metrics")
        assert r.status_code == 401
        assert "mlx_" not in r.text
    with live.client(Authorization="Bearer not-the-key") as wrong:
        assert wrong.get(f"{live.url}/metrics").status_code in (401, 403)


def test_an_operator_can_open_metrics_to_a_local_scraper(tmp_path):
    with serving(tmp_path, MODEL, "--MLXExtension.metrics_unauthenticated=True") as server:
        with server.client() as anonymous:
            samples = scrape(server, anonymous)
            assert value(samples, "mlx_model_ready") in (0.0, 1.0)
            # the rest of the API stays behind the key
            assert anonymous.get(f"{server.url}/models").status_code in (401, 403)
