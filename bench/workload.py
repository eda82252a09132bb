"""N concurrent streaming chats through the openai SDK; per request: time to first token, tokens."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

from openai import OpenAI

TOPICS = ["the sea", "a lighthouse", "mountains", "a city at night", "a library", "the desert", "a forest",
          "a train journey"]


@dataclass
class Sample:
    ttft: float
    tokens: int
    decode_time: float


def prompts(n: int) -> list[str]:
    return [f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]} (variant {i})." for i in range(n)]


def one_chat(client: OpenAI, model: str, text: str, max_tokens: int, extra_messages=None) -> Sample:
    start = time.perf_counter()
    first = None
    tokens = 0
    messages = list(extra_messages or []) + [{"role": "user", "content": text}]
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter()
            tokens += 1
    end = time.perf_counter()
    if usage is not None:
        tokens = usage.completion_tokens
    first = first or end
    return Sample(first - start, tokens, end - first)


def concurrent(server, n: int, max_tokens: int) -> dict:
    client = OpenAI(base_url=server.base_url, api_key=server.api_key, timeout=900, max_retries=0)
    samples: list = [None] * n
    texts = prompts(n)

    def run(i):
        samples[i] = one_chat(client, server.model, texts[i], max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = sum(s.tokens for s in samples)
    ttfts = sorted(s.ttft for s in samples)
    per_stream = [s.tokens / s.decode_time for s in samples if s.decode_time > 0 and s.tokens > 1]
    return {
        "n": n,
        "tokens": total,
        "wall_s": wall,
        "agg_tps": total / wall,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))],
        "stream_tps": statistics.median(per_stream) if per_stream else 0.0,
    }
