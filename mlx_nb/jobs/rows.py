"""One row of a job through the route it names, as the HTTP route would answer it, in the background lane.

A row's body is parsed, turned into engine requests and answered by the same `mlx_nb.api.routes`
code as an HTTP request to that route, so a batch line and a live request cannot disagree. The
difference: the engine requests carry the job's id, so they run as background rows (engine/
background.py). What a row gets back is its output line: the response body with status 200, or
the error a live request would have got (status, code, message), never an exception.

Where the rows go is a `Target`: the engines of this process (`LocalTarget`), which the Jupyter
server and an embedded notebook both use, each with its own way to find a model's engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Optional

from mlx_nb.jobs.lines import output_line

PASSING = (429, 502, 503, 504)  # statuses that say "not now", not "not this row"


class ModelLoadFailure(RuntimeError):
    """The job's model cannot be loaded: the job fails with this reason, its inputs kept."""


class Interrupted(RuntimeError):
    """A row's request was aborted (the job cancelled, the engine closed): it has no result yet."""


class LocalTarget:
    """Engines in this process. `engine_for(model)` -> (engine, the name it serves under[, the LoRA
    adapter loaded on it that the rows decode with]) and may load them; `defaults_for(engine)` -> the
    ServerDefaults its routes use; `embedder_for(model)` -> the ready Embedder for embeddings lines
    (LookupError for a name it does not serve)."""

    def __init__(self, engine_for: Callable[[Optional[str]], tuple[Any, str]],
                 defaults_for: Optional[Callable[[Any], Any]] = None,
                 embedder_for: Optional[Callable[[Optional[str]], Any]] = None):
        self.engine_for = engine_for
        self.defaults_for = defaults_for
        self.embedder_for = embedder_for
        self._opened: dict = {}  # model -> (engine, Serving, adapter) while that engine serves

    async def embedder(self, model: Optional[str]):
        """The ready Embedder for an embeddings line's model; ModelLoadFailure if it cannot load."""
        from mlx_nb.engine import EmbedderUnavailable

        if self.embedder_for is None:
            raise LookupError("embeddings lines need an embedding model, and this job's target serves none")
        try:
            return await asyncio.to_thread(self.embedder_for, model)
        except EmbedderUnavailable as exc:
            raise ModelLoadFailure(str(exc)) from None


    async def open(self, model: Optional[str]):
        """(engine, Serving, adapter or None) for a row's model, once its engine is ready;
        ModelLoadFailure if it cannot load."""
        from mlx_nb.api import ServerDefaults
        from mlx_nb.api.routes import serving_for

        known = self._opened.get(model)
        if known is not None and known[0].ready:  # every row asks: only the first pays for the look-up
            return known
        try:
            found = await asyncio.to_thread(self.engine_for, model)
        except LookupError:  # a name this target does not serve: the row's error
            raise
        except Exception as exc:
            from mlx_nb.registry import ModelUnavailable  # raised by a local engine: MLX is loaded

            if isinstance(exc, ModelUnavailable):  # the memory budget is held by busy models: later
                raise Interrupted(str(exc)) from None
            raise ModelLoadFailure(f"model {model or 'default'} cannot be loaded: {exc}") from None
        engine, name, adapter = (*found, None)[:3]
        try:
            await asyncio.to_thread(engine.wait_ready)
        except Exception as exc:  # the load failed: every row would, so the job fails with the reason
            raise ModelLoadFailure(f"model {model or name} cannot be loaded: {exc}") from None
        defaults = self.defaults_for(engine) if self.defaults_for is not None else ServerDefaults()
        self._opened[model] = opened = (engine, serving_for(engine, name, defaults), adapter)
        return opened

    async def submit(self, engine, requests: list) -> list:
        return await asyncio.to_thread(engine.submit_requests, requests)


def route_for(url: str):
    from mlx_nb.api.routes import CHAT, COMPLETIONS

    return {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}[url]


async def run_row(row: dict, target, job_id: str, source: str, on_handles: Callable[[list], None]) -> dict:
    """The row's output line. ModelLoadFailure (the whole job fails) and Interrupted (no result yet)
    are raised; everything a request can get wrong is the row's own error line."""
    from mlx_nb.api import APIError, from_request_error
    from mlx_nb.engine import RequestError, SubmitRequest

    if row.get("error") is not None:
        return output_line(row, 400, None, row["error"])
    if row["url"] == "/v1/embeddings":
        return await embedding_row(row, target)
    route = route_for(row["url"])
    try:
        engine, serving, adapter = await target.open(row["body"].get("model"))
        req = route.parse(json.dumps(row["body"]).encode(), serving)
        if getattr(req, "stream", False):
            raise APIError(400, "stream is not supported in a batch: leave it out (each result is written whole)",
                           "invalid_request_error", "stream", "invalid_value")
        own = {"adapter": adapter} if adapter else {}
        typed = [SubmitRequest.of(**kw, source=source, job=job_id, **own) for kw in route.engine_requests(req, serving)]
        handles = await target.submit(engine, typed)
        on_handles(handles)
        results = [await h.aresult() for h in handles]
    except (ModelLoadFailure, Interrupted):
        raise
    except APIError as exc:
        if exc.status in PASSING:  # a backend busy or out of reach: not this row's answer, it runs again
            raise Interrupted(f"{exc.status}: {exc.message}") from None
        return _error_line(row, exc)
    except RequestError as exc:
        return _error_line(row, from_request_error(exc))
    except (LookupError, ValueError) as exc:
        return output_line(row, 400, None, {"code": "invalid_request", "message": str(exc)})
    except RuntimeError as exc:
        from mlx_nb.engine import EngineClosedError

        if isinstance(exc, EngineClosedError):  # closed between looking it up and submitting
            raise Interrupted(str(exc)) from None
        raise
    if any(r.finish_reason == "abort" for r in results):
        raise Interrupted(row["row"])
    broken = [r for r in results if r.finish_reason == "error"]
    if broken:
        return output_line(row, 500, None, {"code": "request_failed", "message": broken[0].error or "the request failed"})
    return output_line(row, 200, route.response(req, results, serving, int(time.time())), None)


async def embedding_row(row: dict, target) -> dict:
    """An embeddings line's output line, as the embeddings route would answer it (api/embeddings.py);
    its inputs share the embedder's forwards with every other row waiting."""
    from mlx_nb.api import APIError, from_request_error
    from mlx_nb.api import embeddings as wire
    from mlx_nb.engine import RequestError

    try:
        req = wire.parse_embedding_request(json.dumps(row["body"]).encode())
        embedder = await target.embedder(req.model)
        body = await asyncio.to_thread(wire.answer, req, embedder)
    except APIError as exc:
        return _error_line(row, exc)
    except RequestError as exc:
        return _error_line(row, from_request_error(exc))
    except LookupError as exc:
        return output_line(row, 400, None, {"code": "invalid_request", "message": str(exc)})
    return output_line(row, 200, body, None)


def _error_line(row: dict, exc) -> dict:
    body = exc.to_dict()
    return output_line(row, exc.status, body, {"code": exc.code or exc.type, "message": exc.message})
