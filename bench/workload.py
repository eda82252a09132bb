"""N concurrent streaming chats through the openai SDK; per request: time to first token, tokens.

Every measurement sends prompts no server has seen (a `salt` in the text), so prefix caches can't
serve a repeated run from memory: the numbers are cold throughput, the same for every system.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Optional

from openai import OpenAI

TOPICS = ["the sea", "a lighthouse", "mountains", "a city at night", "a library", "the desert", "a forest",
          "a train journey"]


@dataclass
class Sample:
    ttft: float
    tokens: int
    decode_time: float
    prompt_tokens: Optional[int] = None


def client(server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key=server.api_key, timeout=900, max_retries=0)


def prompts(n: int, salt: str) -> list[str]:
    return [f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]} (variant {i}, run {salt})."
            for i in range(n)]


def one_chat(c: OpenAI, model: str, text: str, max_tokens: int, extra_messages=None, **params) -> Sample:
    start = time.perf_counter()
    first = None
    tokens = 0
    messages = list(extra_messages or []) + [{"role": "user", "content": text}]
    stream = c.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, **params,
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
    return Sample(first - start, tokens, end - first, usage.prompt_tokens if usage else None)


def concurrent(server, n: int, max_tokens: int, salt: str) -> dict:
    c = client(server)
    samples: list = [None] * n
    texts = prompts(n, salt)

    def run(i):
        samples[i] = one_chat(c, server.model, texts[i], max_tokens)

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


def paired_level(servers: list, n: int, max_tokens: int, reps: int) -> list[dict]:
    """Per server, a warm-up at this concurrency (its one-time costs land on nobody), then `reps`
    cold runs, the median run by aggregate tokens/s standing for the level and the spread kept. The
    servers' runs take turns (a, b, a, b, ...): on a shared machine whose speed drifts over minutes,
    each ratio then compares runs made side by side."""
    for server in servers:
        concurrent(server, n, 8, salt=f"warm-{n}")
    runs = [[] for _ in servers]
    for r in range(reps):
        for i, server in enumerate(servers):
            runs[i].append(concurrent(server, n, max_tokens, salt=f"{n}-{r}"))
    out = []
    for rs in runs:
        rs.sort(key=lambda x: x["agg_tps"])
        out.append({**rs[len(rs) // 2], "agg_tps_runs": [x["agg_tps"] for x in rs]})
    return out


def prompt_read(servers: list, text: str, reps: int = 3) -> list[dict]:
    """Reading one long prompt alone, per server: prompt tokens / seconds until the reply (one new
    token), a salt first so no prefix cache serves it; the median of `reps` cold runs, the servers'
    runs taking turns."""
    runs = [[] for _ in servers]
    for r in range(reps + 1):  # the first run warms each server's kernels for this length
        for i, server in enumerate(servers):
            t = time.perf_counter()
            reply = client(server).chat.completions.create(model=server.model, max_tokens=1, temperature=0.0, messages=[
                {"role": "user", "content": f"Reading test {r} ({server.name}). Summarise this text.\n\n{text}"}])
            elapsed = time.perf_counter() - t
            if r:
                runs[i].append((reply.usage.prompt_tokens / elapsed, reply.usage.prompt_tokens, elapsed))
    out = []
    for rs in runs:
        rs.sort()
        tps, tokens, seconds = rs[len(rs) // 2]
        out.append({"prompt_tokens": tokens, "seconds": seconds, "prompt_tps": tps, "prompt_tps_runs": [x[0] for x in rs]})
    return out
