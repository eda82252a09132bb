"""MLXHandler: what every `mlx/v1` route shares — auth, limits, readiness and error bodies.

- Auth: an mlx API key (keys.py: `Authorization: Bearer|token <key>` or `x-api-key: <key>`) is
  accepted here and only here; the request then sees a KeyIdentity and KeyAuthorizer instead of
  the server's. Anything else is Jupyter's own auth: a browser session, or the Jupyter token the
  same two ways (the anthropic SDK's `x-api-key` is presented to the IdentityProvider as
  `Authorization: token <t>`). Whatever provider the server uses (token, password, JupyterHub,
  custom) still decides those, and a token-authenticated request skips XSRF as it would anyway.
- No credentials (or wrong ones) is 401, so SDKs raise their AuthenticationError; an
  authenticated user the authorizer refuses stays 403.
- Every error is JSON in the route's wire shape (OpenAI, or Anthropic for `messages`), never a
  traceback: `write_error` renders `APIError`s from the api layer, engine `RequestError`s as 400s,
  tornado's HTTPErrors, and anything unexpected as a plain 500.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from jupyter_ext.keys import KEY_FILE, KeyAuthorizer, KeyIdentity
from mlx_nb.api import (
    APIError,
    from_request_error,
    model_loading,
    request_too_large,
    server_error,
)
from mlx_nb.engine import RequestError
from mlx_nb.registry import ModelUnavailable

RETRY_AFTER_S = 2
MISSING_KEY = ("missing or invalid API key: send 'Authorization: Bearer <key>' (or 'x-api-key') with an mlx API "
               f"key: the one printed at server start (in Jupyter's runtime dir as {KEY_FILE}) or one set in "
               "MLXExtension.api_keys")
_KINDS = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 405: "invalid_request_error"}


class MLXHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = "mlx"
    anthropic = False  # error bodies in Anthropic's shape (the `messages` route)
    key_identity: Optional[KeyIdentity] = None  # set when the request presented an mlx API key

    @property
    def ext(self):
        """The MLXExtension that owns the engine."""
        return self.extensionapp

    # -- auth and limits ---------------------------------------------------------------------
    @property
    def identity_provider(self):
        return self.key_identity or super().identity_provider

    @property
    def authorizer(self):
        return KeyAuthorizer() if self.key_identity else super().authorizer

    def set_cookie(self, name, value, *args, **kwargs):
        """API clients (a key or token in a header) get no cookies: Jupyter would otherwise hand a
        login cookie to whoever sent the token. A browser session keeps its own."""
        if self.request.headers.get("Authorization", "").strip() or self.request.headers.get("x-api-key"):
            return
        return super().set_cookie(name, value, *args, **kwargs)

    async def prepare(self):
        keys = self.ext.keys
        if keys.accepts(keys.presented(self.request.headers)):
            self.key_identity = KeyIdentity(super().identity_provider)
        key = self.request.headers.get("x-api-key")
        if key and not self.request.headers.get("Authorization", "").strip():
            self.request.headers["Authorization"] = f"token {key}"
        try:
            await super().prepare()
        except web.HTTPError as exc:
            if exc.status_code == 403 and getattr(self, "_jupyter_current_user", None) is None and self.check_host():
                raise web.HTTPError(401, MISSING_KEY) from None
            raise
        if self.request.method in ("POST", "PUT", "PATCH"):
            self._check_body_size()

    def _check_body_size(self) -> None:
        limit = self.ext.max_body_bytes
        declared = self.request.headers.get("Content-Length", "")
        size = max(len(self.request.body), int(declared) if declared.isdigit() else 0)
        if size > limit:
            raise request_too_large(size, limit)

    # -- the engine --------------------------------------------------------------------------
    def engine(self):
        """The engine, created on first use when `load_on_start` is off."""
        return self.ext.start_engine()

    def ready_engine(self, engine=None, name: Optional[str] = None):
        """`engine` (default: the default model's) if it can take requests; else the 503 that says why."""
        engine = engine if engine is not None else self.engine()
        name = name or engine.model_name
        if engine.ready:
            return engine
        if engine.load_error is not None:  # retrying will not help: no Retry-After
            raise APIError(503, f"model {name} failed to load: {engine.load_error}", "service_unavailable", None,
                           "model_load_failed")
        raise model_loading(f"model {name}")  # loading, or unloaded while it loaded: retry

    # -- writing -----------------------------------------------------------------------------
    def write_json(self, body: Any) -> None:
        self.finish(json.dumps(body, ensure_ascii=False))

    def on_finish(self) -> None:
        """Count the finished request for /metrics (jupyter_ext/metrics.py)."""
        counts = getattr(self.ext, "request_counts", None)
        if counts is not None:
            counts.finished(self.request.path, self.get_status(), bool(getattr(self, "gone", False)))

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, (APIError, RequestError, ModelUnavailable)):  # said to the client: no traceback
            self.log.info("mlx: %s %s -> %s", self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        error = as_api_error(status_code, exc, self._reason, getattr(self, "wire_fields", None))
        self.set_status(error.status)
        if error.code == "model_loading":
            self.set_header("Retry-After", str(RETRY_AFTER_S))
        if error.status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="mlx"')
        self.finish(json.dumps(error.to_anthropic_dict() if self.anthropic else error.to_dict()))


def as_api_error(status: int, exc: Optional[BaseException], reason: str = "",
                 fields: Optional[dict] = None) -> APIError:
    """Any failure as an APIError; only our own messages reach the client, never a traceback.
    `fields` maps the engine's field names to the route's."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestError):
        return from_request_error(exc, fields)
    if isinstance(exc, ModelUnavailable):  # the memory budget: not the client's mistake, nor a crash
        return APIError(503, str(exc), "service_unavailable", "model", "model_too_large")
    if isinstance(exc, web.HTTPError):
        status = exc.status_code
        message = exc.log_message or exc.reason or reason
        if exc.log_message and exc.args:  # tornado formats log_message with its args
            message = exc.log_message % exc.args
        if status == 403 and "_xsrf" in message:  # a token-less server refusing a POST from an API client
            message += ": this server has no token; give it one (API clients send it as the key), or start it "\
                       "with --ServerApp.disable_check_xsrf=True"
        kind = _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
        return APIError(status, message, kind, None, None)
    if status < 500:
        return APIError(status, reason or "bad request", "invalid_request_error")
    return server_error("internal server error: see the Jupyter server log")
