"""Prefix reuse and long-prompt interference, measured through a server's OpenAI route."""

from __future__ import annotations

import threading
import time

from workload import client, one_chat

FILLER = (
    "The committee reviewed the quarterly figures, the staffing plan and the maintenance schedule for the "
    "northern depot, and agreed to revisit the budget once the contractor's estimate arrives. "
)


def text_of(tokenizer, n_tokens: int) -> str:
    """FILLER repeated and cut to about `n_tokens` tokens of this model's tokenizer."""
    per_copy = len(tokenizer.encode(FILLER * 20)) / 20
    text = FILLER * (int(n_tokens / per_copy) + 1)
    return text[: int(len(text) * n_tokens / len(tokenizer.encode(text)))]


def shared_prefix_ttft(server, system_text: str) -> dict:
    """TTFT of a cold request with a long shared system prompt, then of a second one reusing it."""
    c = client(server)
    system = [{"role": "system", "content": system_text}]
    cold = one_chat(c, server.model, "Summarise the notes in one line.", 8, system)
    warm = one_chat(c, server.model, "What should happen next? One line.", 8, system)
    return {"prompt_tokens": cold.prompt_tokens, "cold_ttft": cold.ttft, "warm_ttft": warm.ttft,
            "speedup": cold.ttft / max(warm.ttft, 1e-6)}


def turn_costs(server, turns: int = 5) -> dict:
    """TTFT of each turn of a growing conversation (each turn re-sends the whole history)."""
    c = client(server)
    history = [{"role": "system", "content": FILLER * 4}]
    ttfts = []
    for i in range(turns):
        history.append({"role": "user", "content": f"Question {i + 1}: add one more detail to the notes."})
        t = time.perf_counter()
        first = None
        text = ""
        for chunk in c.chat.completions.create(model=server.model, messages=history, max_tokens=48,
                                               temperature=0.0, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                text += chunk.choices[0].delta.content
        ttfts.append((first or time.perf_counter()) - t)
        history.append({"role": "assistant", "content": text})
    return {"ttft_by_turn": ttfts, "turn5_over_turn1": ttfts[-1] / max(ttfts[0], 1e-6)}


def long_prompt_interference(server, long_text: str, eos_ids: list[int], window: float = 4.0) -> dict:
    """A running stream's pace before and while a long prompt is prefilled, and its longest pause.

    The stream's end-of-sequence tokens get a -100 logit bias, so it cannot end mid-measurement."""
    c = client(server)
    stamps: list[float] = []
    stop = threading.Event()

    def runner():
        stream = c.chat.completions.create(
            model=server.model, max_tokens=4000, temperature=0.0, stream=True,
            messages=[{"role": "user", "content": "Count upwards from one, forever."}],
            logit_bias={str(t): -100 for t in eos_ids})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.perf_counter())
            if stop.is_set():
                stream.close()
                return

    th = threading.Thread(target=runner)
    th.start()
    while len(stamps) < 5:
        time.sleep(0.05)
    time.sleep(window)
    t_long = time.perf_counter()
    long_sample = one_chat(c, server.model, long_text + "\nSummarise.", 1)
    t_first = t_long + long_sample.ttft
    stop.set()
    th.join(60)
    before = [s for s in stamps if t_long - window <= s < t_long]
    during = [s for s in stamps if t_long <= s < t_first]
    edges = [t_long, *during, t_first]
    return {
        "prompt_tokens": long_sample.prompt_tokens,
        "prefill_s": long_sample.ttft,
        "before_tps": len(before) / window,
        "during_tps": len(during) / max(t_first - t_long, 1e-6),
        "longest_pause_s": max(b - a for a, b in zip(edges, edges[1:])),
    }
