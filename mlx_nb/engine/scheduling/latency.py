"""Latency histograms the engine keeps: time to first token and the gap between tokens, per request.

Plain bucket counts (Prometheus' cumulative `le` form at export), kept on the engine thread and
read through `status()`, so the engine needs no metrics library; the server's `/metrics` route
exports them (jupyter_ext/metrics.py)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


@dataclass
class Histogram:
    buckets: tuple
    counts: list = field(default_factory=list)  # per bucket, the last one past every bound (+Inf)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict:
        """{"buckets": [[upper bound, cumulative count], ...] ending with "+Inf", "sum", "count"}."""
        total, out = 0, []
        for bound, n in zip([*self.buckets, "+Inf"], self.counts):
            total += n
            out.append([bound, total])
        return {"buckets": out, "sum": self.sum, "count": self.count}


class Latency:
    def __init__(self):
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def token(self, live, now: float) -> None:
        """A request emitted a token at `now` (perf_counter): its first, or the gap since its last."""
        if live.last_token_at is None:
            self.ttft.observe(now - live.submitted_at)
        else:
            self.itl.observe(now - live.last_token_at)
        live.last_token_at = now

    def snapshot(self) -> dict:
        return {"time_to_first_token_s": self.ttft.snapshot(), "inter_token_latency_s": self.itl.snapshot()}
