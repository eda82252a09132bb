"""`/metrics` in Prometheus' text format, for a JupyterHub operator's dashboard.

Read when scraped, from what the server and the engine already count: requests by route and
outcome (counted here, as each response finishes), prompt and generated tokens, the batch's size,
the queue, requests being prefilled, time-to-first-token and inter-token latency histograms (the
engine's, `engine/scheduling/latency.py`), prefix-cache hits, stored tokens and bytes, and memory; every
series carries the served model's name. Behind the mlx API key like the other routes;
`MLXExtension.metrics_unauthenticated` opens it to a local scraper without one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

from jupyter_server.auth.decorator import allow_unauthenticated
from tornado import web

from jupyter_ext.base import MISSING_KEY, MLXHandler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestCounts:
    """Finished requests by (route, outcome): the server's own count, kept as responses finish."""

    def __init__(self):
        self.counts: Counter = Counter()

    def finished(self, path: str, status: int, client_left: bool) -> None:
        route = path.split("mlx/v1/", 1)[-1].strip("/") or "root"
        if route in ("metrics", "events", "health", "status") or route.endswith(".svg"):
            return  # watching the server is not a request to it
        outcome = ("aborted" if client_left else "ok" if status < 400 else "client_error" if status < 500
                   else "server_error")
        self.counts[(route, outcome)] += 1


class EngineCollector:
    """A prometheus_client collector: each scrape reads the engine's status once."""

    def __init__(self, ext: Any):
        self.ext = ext

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        engine = self.ext.engine
        model = engine.model_name if engine is not None else self.ext.model
        requests = CounterMetricFamily("mlx_requests", "Finished requests, by route and outcome",
                                       labels=["model", "route", "outcome"])
        for (route, outcome), n in sorted(self.ext.request_counts.counts.items()):
            requests.add_metric([model, route, outcome], n)
        yield requests
        ready = GaugeMetricFamily("mlx_model_ready", "1 once the model serves requests", labels=["model"])
        ready.add_metric([model], 1.0 if engine is not None and engine.ready else 0.0)
        registered = [m for m in self.ext.registry.describe() if not m["pinned"]]
        for m in registered:  # the other models this server may load
            ready.add_metric([m["name"]], 1.0 if m["state"] == "loaded" else 0.0)
        yield ready
        if registered:
            reserved = GaugeMetricFamily("mlx_model_reserved_bytes", "What a loaded model counts against the "
                                         "memory budget (weights and its prefix cache's budget)", labels=["model"])
            for m in registered:
                reserved.add_metric([m["name"]], float(m["reserved_bytes"] or 0))
            yield reserved
            yield GaugeMetricFamily("mlx_memory_budget_bytes", "Bytes the loaded models may hold together",
                                    value=float(self.ext.registry.budget_bytes))
        if engine is None or not engine.ready:
            return
        status = engine.status()

        def counter(name: str, doc: str, value: float) -> Any:
            family = CounterMetricFamily(name, doc, labels=["model"])
            family.add_metric([model], value)
            return family

        def gauge(name: str, doc: str, value: float) -> Any:
            family = GaugeMetricFamily(name, doc, labels=["model"])
            family.add_metric([model], value)
            return family

        yield counter("mlx_prompt_tokens", "Prompt tokens read", status.get("prompt_tokens", 0))
        yield counter("mlx_generation_tokens", "Tokens generated", status.get("generated_tokens", 0))
        yield counter("mlx_steps", "Batch steps run", status.get("steps", 0))
        yield gauge("mlx_batch_size", "Requests decoding in the batch now", status.get("batch_size", 0))
        yield gauge("mlx_queue_length", "Requests waiting to start", status.get("queue_length", 0))
        yield gauge("mlx_prefilling", "Requests whose prompt is being read", status.get("prefilling", 0))
        lane = status.get("background") or {}  # dataset jobs' rows (engine/scheduling/background.py)
        yield counter("mlx_job_rows", "Dataset job rows finished", lane.get("rows_done", 0))
        yield counter("mlx_job_rows_yielded", "Times a job row left the batch for interactive requests",
                      lane.get("yielded", 0))
        yield gauge("mlx_job_rows_waiting", "Dataset job rows waiting for a batch slot", lane.get("waiting", 0))
        yield gauge("mlx_job_rows_in_batch", "Dataset job rows in the batch now", lane.get("in_batch", 0))
        for key, name, doc in (("time_to_first_token_s", "mlx_time_to_first_token_seconds",
                                "Seconds from a request's submission to its first token"),
                               ("inter_token_latency_s", "mlx_inter_token_latency_seconds",
                                "Seconds between a request's consecutive tokens")):
            snap = (status.get("latency") or {}).get(key)
            if snap:
                family = HistogramMetricFamily(name, doc, labels=["model"])
                family.add_metric([model], [(str(b), float(n)) for b, n in snap["buckets"]], sum_value=snap["sum"])
                yield family
        prefix = status.get("prefix_cache") or {}
        if prefix.get("enabled"):
            hits = CounterMetricFamily("mlx_prefix_cache_hits", "Prefix-cache hits, by kind",
                                       labels=["model", "kind"])
            for kind, n in sorted((prefix.get("hits") or {}).items()):
                hits.add_metric([model, kind], n)
            yield hits
            yield counter("mlx_prefix_cache_tokens_saved", "Prompt tokens served from the prefix cache",
                          prefix.get("tokens_saved", 0))
            yield gauge("mlx_prefix_cache_bytes", "Bytes the prefix cache holds", prefix.get("bytes", 0))
            yield gauge("mlx_prefix_cache_entries", "Entries the prefix cache holds", prefix.get("entries", 0))
        memory = GaugeMetricFamily("mlx_memory_bytes", "Memory, by kind", labels=["model", "kind"])
        for kind, value in sorted((status.get("memory") or {}).items()):
            if kind.endswith("_bytes") and isinstance(value, (int, float)):
                memory.add_metric([model, kind[: -len("_bytes")]], value)
        yield memory


class MetricsHandler(MLXHandler):
    """GET /mlx/v1/metrics: the text exposition format."""

    def check_xsrf_cookie(self) -> None:  # a GET: nothing to forge
        return

    @allow_unauthenticated
    async def get(self):
        if not self.ext.metrics_unauthenticated and self.current_user is None:  # the key, as every mlx route
            raise web.HTTPError(401, MISSING_KEY)
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(EngineCollector(self.ext))
        self.finish(generate_latest(registry), set_content_type=CONTENT_TYPE)
