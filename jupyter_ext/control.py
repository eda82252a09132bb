"""The controlling route: `DELETE mlx/v1/requests/{id}` aborts a live request, whoever sent it.

The Lab's MLX sidebar lists every notebook's and client's requests with an Abort button; the
notebook widgets abort their own through their stream. The request ends with finish_reason
"abort" at the engine's next step (its client sees that), its batch slot is freed, and the
others go on. A request that is not live (finished, or never existed) is a 404. With
`backend_url` set there is no engine here to abort in: a 404 says so.
"""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_ext.base import MLXHandler
from mlx_nb.api import not_found


class RequestHandler(MLXHandler):
    @web.authenticated
    @authorized
    async def delete(self, request_id: str):
        if self.ext.remote is not None:
            raise not_found("this server relays a backend: abort a request by closing its stream")
        engine = self.ready_engine()
        live = {r["id"] for r in (await asyncio.to_thread(engine.status))["requests"]}
        if request_id not in live:
            raise not_found(f"no live request {request_id!r}: it finished or never existed")
        engine.abort(request_id)
        self.set_status(202)
        self.write_json({"id": request_id, "aborting": True})
