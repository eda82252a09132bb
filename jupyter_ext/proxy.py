"""What the `mlx/v1` handlers do when `backend_url` is set: pass requests through to the backend
(`jupyter_ext.remote.RemoteEngine`), and report what the backend exposes about itself.

Pass-through keeps the client's body (model name mapped to the backend's) and streams the
backend's bytes back as they come; a client that leaves closes the backend connection, so the
backend drops the request. Errors come back in our shape: the backend's 4xx as the client's
mistake, its 5xx and an unreachable backend as 502.
"""

from __future__ import annotations

from typing import Optional

from tornado.iostream import StreamClosedError

from jupyter_ext.remote import UNNAMED, backend_error
from mlx_nb.api import models_list, not_found
from mlx_nb.api.request_common import load_body

STATUS_SOURCES = {  # what a backend may expose about its batch, and where (relative to backend_url or its root)
    "status": ("status", False),  # another `jupyter mlx` (mlx/v1/status)
    "metrics": ("metrics", True),  # vLLM, llama.cpp's server (--metrics), SGLang: Prometheus text
    "slots": ("slots", True),  # llama.cpp's server: per-slot state
}


class ProxyMixin:
    """Mixed into MLXHandler subclasses; every method assumes `self.ext.remote` is set."""

    async def proxy_post(self, path: str) -> None:
        remote = self.ext.remote
        body = load_body(self.request.body)
        model = await remote.model()
        self.ext.server_defaults().resolve_model(body.get("model"), [model])  # 404 for a name it cannot mean
        if model == UNNAMED:
            body.pop("model", None)  # the backend's default model
        else:
            body["model"] = model
        await self.relay(await remote.open("POST", path, body))

    async def proxy_get(self, path: str, params: Optional[dict] = None, what: str = "") -> None:
        remote = self.ext.remote
        if path == "models" and not await remote.models():  # a backend that lists nothing serves its default
            return self.write_json(models_list([await remote.model()]))
        resp = await remote.open("GET", path, params=params)
        if resp.status_code == 404 and what:
            await resp.aclose()
            raise not_found(f"the backend at {remote.url} exposes no {what} (no {path} route)")
        await self.relay(resp)

    async def relay(self, resp) -> None:
        """The backend's answer, streamed through; its errors re-raised in our shape."""
        if resp.status_code >= 400:
            raise await backend_error(resp, self.ext.remote.url)
        content_type = resp.headers.get("content-type", "application/json")
        self.set_header("Content-Type", content_type)
        if content_type.startswith("text/event-stream"):
            self.set_header("Cache-Control", "no-cache")
            self.set_header("X-Accel-Buffering", "no")
        try:
            async for chunk in resp.aiter_raw():
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            return  # the client left; closing the backend response below makes the backend stop too
        finally:
            await resp.aclose()
        self.finish()


async def remote_status(remote) -> dict:
    """The backend's own status where it has one, plus what it exposes and what it does not."""
    out: dict = {"backend": remote.url, "loading": False, "error": None, "requests": []}
    try:
        out["model"] = await remote.model()
    except Exception as exc:  # an unreachable backend is a status to show, not a failure of this route
        return {**out, "ready": False, "error": str(getattr(exc, "message", exc)), "exposes": {}}
    exposes = {}
    for name, (path, at_root) in STATUS_SOURCES.items():
        resp = await remote.get(path, root=at_root)
        exposes[name] = resp.status_code == 200
        if not exposes[name]:
            continue
        if name == "metrics":
            out["metrics"] = prometheus_samples(resp.text)
        else:
            try:
                body = resp.json()
            except ValueError:
                exposes[name] = False
                continue
            if name == "status" and isinstance(body, dict):
                out.update({k: v for k, v in body.items() if k != "model"})
            else:
                out[name] = body
    out["ready"] = True
    out["exposes"] = exposes
    missing = [f"/{STATUS_SOURCES[n][0]}" for n, shown in exposes.items() if not shown]
    out["not_exposed"] = (
        f"the backend at {remote.url} exposes no {', '.join(missing)}: what it does not publish "
        "(per-request phases, batch size, cache layout, batch events) cannot be shown here"
    ) if missing else None
    return out


def prometheus_samples(text: str, limit: int = 400) -> dict:
    """`{metric{labels}: value}` from Prometheus text (comments skipped), at most `limit` samples."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name] = float(value)
        except ValueError:
            continue
        if len(samples) >= limit:
            break
    return samples
