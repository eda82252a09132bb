"""Soak: many mixed requests against a live server, watching for hangs, 5xx and memory growth.

Users do not send one clean request at a time. Each request here is drawn (seeded) from the mix a
shared notebook server sees: streamed and whole chats, completions, Anthropic messages, streams the
client abandons after a few tokens, clients that hang up before any answer, conversations that
return with their history (prefix-cache hits), malformed bodies, and images when a vision server is
given. Workers send them concurrently; a sampler thread reads the server's RSS and its own memory
report the whole time.

Pass: no request hangs (each has a deadline), no 5xx, and RSS after the warm-up grows < 10%. The
prefix cache grows until it reaches its byte budget, then evicts (that growth is the cache doing its
job, bounded by the budget): the warm-up is sized so the budget is reached in it.

    python bench/soak.py                       # 1,000 requests, default model + a vision fixture
    python bench/soak.py --requests 200 --model tiny-llama

Writes bench/results/soak.json, soak.md and soak_memory.png.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import httpx

HERE = Path(__file__).resolve().parent
DEADLINE_S = 300.0  # a request with no answer by then counts as a hang
KINDS_TEXT = {  # relative weights of the mix
    "chat": 4, "chat_stream": 4, "completion": 2, "messages": 2, "messages_stream": 2,
    "abandon_stream": 2, "hang_up": 1, "follow_up": 3, "bad_input": 2,
}
SYSTEMS = [f"You are a helpful assistant number {i}. Answer briefly and plainly." for i in range(6)]
TOPICS = ["the sea", "a city", "bread", "rain", "a clock", "music", "stars", "a garden", "winter", "trains"]


@dataclass
class Outcome:
    kind: str
    status: int  # HTTP status; 0 when the client left on purpose, -1 for a hang or transport error
    seconds: float
    detail: str = ""


@dataclass
class Sample:
    t: float
    requests_done: int
    rss_bytes: int
    active_bytes: Optional[int] = None
    prefix_bytes: Optional[int] = None


@dataclass
class SoakResult:
    requests: int
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    warmup_requests: int = 0

    @property
    def hangs(self) -> int:
        return sum(1 for o in self.outcomes if o.status == -1)

    @property
    def server_errors(self) -> int:
        return sum(1 for o in self.outcomes if o.status >= 500)

    def rss_growth(self) -> float:
        """RSS at the end over RSS when the warm-up ended (medians of a few samples each)."""
        after = [s for s in self.samples if s.requests_done >= self.warmup_requests]
        if len(after) < 4:
            return 0.0
        k = max(2, len(after) // 10)
        start = sorted(s.rss_bytes for s in after[:k])[k // 2]
        end = sorted(s.rss_bytes for s in after[-k:])[k // 2]
        return end / start - 1.0

    def summary(self) -> dict:
        by_kind: dict = {}
        for o in self.outcomes:
            row = by_kind.setdefault(o.kind, Counter())
            row[str(o.status)] += 1
        return {
            "requests": self.requests,
            "hangs": self.hangs,
            "server_errors": self.server_errors,
            "rss_growth_after_warmup": round(self.rss_growth(), 4),
            "rss_start_bytes": self.samples[0].rss_bytes if self.samples else None,
            "rss_end_bytes": self.samples[-1].rss_bytes if self.samples else None,
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        }


# -- one request of each kind ----------------------------------------------------------------------
class Driver:
    """Sends requests to one server (`url` ends in /mlx/v1) with raw HTTP, as any client would."""

    def __init__(self, url: str, token: str, model: str, max_tokens: int = 24, image: Optional[str] = None):
        self.url, self.model, self.max_tokens, self.image = url, model, max_tokens, image
        self.headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(headers=self.headers, timeout=httpx.Timeout(DEADLINE_S, connect=10), trust_env=False)
        self.history: list[list[dict]] = []  # finished conversations, continued by follow-ups
        self.lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def _chat_body(self, rng: random.Random, stream: bool, messages: Optional[list] = None) -> dict:
        messages = messages or [{"role": "system", "content": rng.choice(SYSTEMS)},
                                {"role": "user", "content": f"Tell me about {rng.choice(TOPICS)} in {rng.randint(2, 9)} words."}]
        return {"model": self.model, "messages": messages, "max_tokens": rng.randint(4, self.max_tokens),
                "temperature": rng.choice([0.0, 0.0, 0.7]), "stream": stream}

    def _stream(self, path: str, body: dict, stop_after: Optional[int] = None) -> tuple[int, str]:
        text = []
        with self.http.stream("POST", f"{self.url}/{path}", json=body) as r:
            if r.status_code >= 400:
                r.read()
                return r.status_code, r.text[:200]
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data:") and line.strip() != "data: [DONE]":
                    seen += 1
                    text.append(line)
                    if stop_after is not None and seen >= stop_after:
                        return 0, "left after %d events" % seen  # closing the response aborts upstream
        return r.status_code, ""

    def send(self, kind: str, rng: random.Random) -> Outcome:
        t0 = time.perf_counter()
        try:
            status, detail = getattr(self, f"_{kind}")(rng)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            status, detail = -1, f"{type(exc).__name__}: {exc}"
        return Outcome(kind, status, time.perf_counter() - t0, detail)

    def _chat(self, rng):
        body = self._chat_body(rng, False)
        r = self.http.post(f"{self.url}/chat/completions", json=body)
        if r.status_code == 200:
            answer = r.json()["choices"][0]["message"]["content"] or ""
            with self.lock:
                self.history.append(body["messages"] + [{"role": "assistant", "content": answer}])
                del self.history[:-50]
        return r.status_code, "" if r.status_code < 400 else r.text[:200]

    def _chat_stream(self, rng):
        return self._stream("chat/completions", self._chat_body(rng, True))

    def _follow_up(self, rng):
        with self.lock:
            past = rng.choice(self.history) if self.history else None
        messages = (past or self._chat_body(rng, False)["messages"]) + [
            {"role": "user", "content": f"And what about {rng.choice(TOPICS)}?"}]
        return self._stream("chat/completions", self._chat_body(rng, True, messages))

    def _completion(self, rng):
        body = {"model": self.model, "prompt": f"A short note on {rng.choice(TOPICS)}:", "max_tokens": rng.randint(4, self.max_tokens)}
        r = self.http.post(f"{self.url}/completions", json=body)
        return r.status_code, "" if r.status_code < 400 else r.text[:200]

    def _messages_body(self, rng, stream):
        return {"model": self.model, "max_tokens": rng.randint(4, self.max_tokens), "stream": stream,
                "system": rng.choice(SYSTEMS), "messages": [{"role": "user", "content": f"Describe {rng.choice(TOPICS)}."}]}

    def _messages(self, rng):
        r = self.http.post(f"{self.url}/messages", json=self._messages_body(rng, False))
        return r.status_code, "" if r.status_code < 400 else r.text[:200]

    def _messages_stream(self, rng):
        return self._stream("messages", self._messages_body(rng, True))

    def _abandon_stream(self, rng):
        body = self._chat_body(rng, True)
        body["max_tokens"] = 200
        return self._stream("chat/completions", body, stop_after=rng.randint(1, 4))

    def _hang_up(self, rng):
        """Send a request and leave before any answer (a client with a tiny read timeout)."""
        body = self._chat_body(rng, True)
        body["max_tokens"] = 200
        try:
            with httpx.Client(headers=self.headers, timeout=httpx.Timeout(0.05, connect=10), trust_env=False) as c:
                r = c.post(f"{self.url}/chat/completions", json=body)
                return r.status_code, "answered before the hang-up"
        except httpx.ReadTimeout:
            return 0, "hung up"

    def _bad_input(self, rng):
        bodies = [
            b"{not json", b"[]", b'{"messages": "hi"}',
            json.dumps({"model": self.model, "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}).encode(),
            json.dumps({"model": self.model, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            json.dumps({"model": self.model, "messages": [{"role": "user", "content": [{"type": "image_url",
                        "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}).encode(),
            json.dumps({"model": self.model, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(),
        ]
        r = self.http.post(f"{self.url}/chat/completions", content=rng.choice(bodies),
                           headers={"Content-Type": "application/json"})
        ok = 400 <= r.status_code < 500
        return r.status_code, "" if ok else f"bad input answered {r.status_code}: {r.text[:200]}"

    def _image(self, rng):
        content = [{"type": "text", "text": f"What is in the picture? ({rng.randint(0, 999)})"},
                   {"type": "image_url", "image_url": {"url": self.image}}]
        body = self._chat_body(rng, rng.random() < 0.5, [{"role": "user", "content": content}])
        if body["stream"]:
            return self._stream("chat/completions", body)
        r = self.http.post(f"{self.url}/chat/completions", json=body)
        return r.status_code, "" if r.status_code < 400 else r.text[:200]


def png_data_url(size: int = 56, seed: int = 0) -> str:
    from PIL import Image

    rng = random.Random(seed)
    img = Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# -- the soak ------------------------------------------------------------------------------------
def proc_rss(pid: int) -> int:
    import os

    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(drivers: list[tuple[Driver, dict]], pid: int, requests: int, *, workers: int = 8, seed: int = 0,
         warmup: float = 0.1, sample_every_s: float = 1.0, status: Optional[Callable[[], dict]] = None,
         progress: Optional[Callable[[int], None]] = None) -> SoakResult:
    """Send `requests` requests drawn from the weighted kinds of each (driver, weights), `workers` at a time."""
    rng = random.Random(seed)
    plan = []
    for _ in range(requests):
        driver, weights = rng.choices(drivers, weights=[sum(w.values()) for _, w in drivers])[0]
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        plan.append((driver, kind, rng.randrange(1 << 30)))
    result = SoakResult(requests, warmup_requests=int(requests * warmup))
    lock = threading.Lock()
    done = threading.Event()
    started = time.perf_counter()

    def sampler():
        while not done.is_set():
            sample = Sample(time.perf_counter() - started, len(result.outcomes), proc_rss(pid))
            if status is not None:
                try:
                    memory = status().get("memory", {})
                    sample.active_bytes, sample.prefix_bytes = memory.get("active_bytes"), memory.get("prefix_cache_bytes")
                except Exception:
                    pass
            result.samples.append(sample)
            done.wait(sample_every_s)

    def worker():
        while True:
            with lock:
                if not plan:
                    return
                driver, kind, s = plan.pop(0)
            outcome = driver.send(kind, random.Random(s))
            with lock:
                result.outcomes.append(outcome)
                if progress is not None:
                    progress(len(result.outcomes))

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S * (requests / workers + 1))
    done.set()
    watcher.join(5)
    result.samples.append(Sample(time.perf_counter() - started, len(result.outcomes), proc_rss(pid)))
    return result


# -- bench entry point -----------------------------------------------------------------------------
def plot(result: SoakResult, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [s.requests_done for s in result.samples]
    ax.plot(xs, [s.rss_bytes / 2**20 for s in result.samples], label="server RSS")
    if any(s.active_bytes for s in result.samples):
        ax.plot(xs, [(s.active_bytes or 0) / 2**20 for s in result.samples], label="MLX active memory")
        ax.plot(xs, [(s.prefix_bytes or 0) / 2**20 for s in result.samples], label="prefix cache")
    ax.axvline(result.warmup_requests, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("requests finished")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    import mlx_nb  # noqa: F401  (fast BLAS before MLX in anything this process imports)
    from servers import mlx_nb_server

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--vision-model", default="tiny-qwen3-vl", help="'' for none")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--prefix-cache-mib", type=int, default=256,
                    help="the server's prefix-cache budget: small enough that the warm-up fills it")
    ap.add_argument("--warmup", type=float, default=0.25, help="share of the requests before RSS is compared")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)

    from contextlib import ExitStack

    with ExitStack() as stack:
        text = stack.enter_context(mlx_nb_server(args.model, logs / "soak-server.log",
                                                 f"--MLXExtension.prefix_cache_bytes={args.prefix_cache_mib << 20}"))
        drivers = [(Driver(text.base_url, text.api_key, text.model), KINDS_TEXT)]
        if args.vision_model:
            vision = stack.enter_context(mlx_nb_server(args.vision_model, log=logs / "soak-vision.log"))
            drivers.append((Driver(vision.base_url, vision.api_key, vision.model, image=png_data_url()),
                            {"image": 3, "chat_stream": 1, "abandon_stream": 1}))
        status_http = httpx.Client(headers={"Authorization": f"Bearer {text.api_key}"}, timeout=30, trust_env=False)
        t0 = time.time()
        result = soak(drivers, text.proc.pid, args.requests, workers=args.workers, warmup=args.warmup,
                      status=lambda: status_http.get(f"{text.base_url}/status").json(),
                      progress=lambda n: n % 100 == 0 and print(f"{n} requests", flush=True))
        wall = time.time() - t0
        for d, _ in drivers:
            d.close()
    summary = {**result.summary(), "model": args.model, "prefix_cache_mib": args.prefix_cache_mib, "vision_model": args.vision_model or None,
               "workers": args.workers, "wall_s": round(wall, 1), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (args.out / "soak.json").write_text(json.dumps({"summary": summary, "samples": [asdict(s) for s in result.samples],
                                                    "outcomes": [asdict(o) for o in result.outcomes]}, indent=1))
    plot(result, args.out / "soak_memory.png", f"{args.requests} mixed requests, {args.model}")
    ok = result.hangs == 0 and result.server_errors == 0 and result.rss_growth() < 0.10
    lines = [f"# Soak: {args.requests} mixed requests ({summary['date']})", "",
             f"Model {args.model}" + (f", images on {args.vision_model}" if args.vision_model else "") +
             f"; {args.workers} concurrent clients; {wall:.0f} s; prefix-cache budget {args.prefix_cache_mib} MiB "
             f"(the first {int(100 * args.warmup)}% of the requests fill it: the warm-up).", "",
             "| measure | result | target |", "|---|---|---|",
             f"| hangs | {result.hangs} | 0 |", f"| 5xx answers | {result.server_errors} | 0 |",
             f"| RSS growth after warm-up | {100 * result.rss_growth():.1f}% | < 10% |",
             f"| RSS start / end | {summary['rss_start_bytes'] / 2**20:.0f} / {summary['rss_end_bytes'] / 2**20:.0f} MiB | |",
             "", "| kind | outcomes (HTTP status: count; 0 = the client left on purpose) |", "|---|---|"]
    lines += [f"| {k} | {', '.join(f'{s}: {n}' for s, n in sorted(v.items()))} |" for k, v in summary["by_kind"].items()]
    lines += ["", "![memory over time](soak_memory.png)", ""]
    (args.out / "soak.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
