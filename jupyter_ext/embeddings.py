"""OpenAI's `embeddings` route: a thin adapter over mlx_nb.api.embeddings and the server's embedder.

The default embedder (all-MiniLM-L6-v2, from its PyPI package) is listed in `models` with
`"kind": "embedding"` and loaded by the first request that needs it, on its own thread; requests
arriving together share its forwards (engine/embedding/embedder.py). With `backend_url` set, the
route is relayed to the backend as the chat routes are.
"""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_ext.base import MLXHandler
from jupyter_ext.proxy import ProxyMixin
from mlx_nb.api import embeddings as wire
from mlx_nb.api.errors import APIError, model_not_found, server_error
from mlx_nb.api.request_common import load_body
from mlx_nb.engine import DEFAULT_EMBEDDER, EmbedderUnavailable


class EmbeddingsHandler(ProxyMixin, MLXHandler):
    @web.authenticated
    @authorized
    async def post(self):
        if self.ext.remote is not None:  # the body as sent: the backend's embedder is named by the client
            return await self.relay(await self.ext.remote.open("POST", "embeddings", load_body(self.request.body)))
        req = wire.parse_embedding_request(self.request.body)
        try:
            embedder = await asyncio.to_thread(self.ext.embedder_named, req.model)
        except LookupError:
            raise model_not_found(req.model, self.ext.embedding_model_names()) from None
        except EmbedderUnavailable as exc:
            raise embedder_unavailable(exc) from None
        try:
            body = await asyncio.to_thread(wire.answer, req, embedder)
        except (RuntimeError, MemoryError) as exc:  # the model's thread failed: not the client's doing
            raise server_error(f"{embedder.model_name} failed: {exc}") from None
        self.write_json(body)


def embedder_unavailable(exc: Exception) -> APIError:
    return APIError(503, f"{DEFAULT_EMBEDDER}: {exc}", "service_unavailable", "model", "model_load_failed")
