"""How the kernels of this server reach its engine: MLX_NB_URL and MLX_NB_TOKEN in their environment.

Local kernels inherit the server process's environment (jupyter_client copies `os.environ` when it
launches one), so setting the two variables here is all it takes for `mlx_nb.Client()` in any
notebook to talk to the shared engine instead of loading its own. The token is the server's mlx
API key (keys.py), which opens the mlx routes only, never the Jupyter token. The URL is the
server's own when kernels can use it (plain HTTP over TCP); a server on TLS (its certificate need
not name 127.0.0.1) or on a unix socket (no URL an HTTP client takes) gets a loopback port that
serves the mlx routes and nothing else (`KernelPort`). Both work whatever the server's auth is
(token, password, JupyterHub), since the key is ours. Previous values come back when it stops.
"""

from __future__ import annotations

import os
from typing import Optional

from jupyter_server.utils import url_path_join
from tornado import httpserver, netutil, web

URL_VAR = "MLX_NB_URL"
TOKEN_VAR = "MLX_NB_TOKEN"
_LOOPBACK = {"": "127.0.0.1", "localhost": "127.0.0.1", "0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "::": "[::1]"}


def direct_url(serverapp) -> Optional[str]:
    """`http://127.0.0.1:<port><base_url>mlx/v1`, as a kernel on this machine reaches it; None when
    the server is on TLS or a unix socket.

    Kernels are local, so a wildcard or `localhost` bind is reached over loopback (the server
    binds loopback for `localhost` too).
    """
    if getattr(serverapp, "sock", "") or serverapp.certfile:
        return None
    ip = serverapp.ip or ""
    host = _LOOPBACK.get(ip, f"[{ip}]" if ":" in ip else ip)
    return f"http://{host}:{serverapp.port}{url_path_join(serverapp.base_url, 'mlx/v1')}"


class KernelPort:
    """A plain-HTTP port on 127.0.0.1 serving only the mlx routes, with the server's settings (so
    its auth: the key, or Jupyter's). Loopback traffic is not readable by other users; the port
    still needs a key."""

    def __init__(self) -> None:
        self.server: Optional[httpserver.HTTPServer] = None

    def start(self, serverapp, handlers: list) -> str:
        settings = {k: v for k, v in serverapp.web_app.settings.items() if not k.startswith("static_")}
        app = web.Application(handlers, **settings)  # no static files, no Jupyter routes
        sockets = netutil.bind_sockets(0, "127.0.0.1")
        self.server = httpserver.HTTPServer(
            app, max_body_size=serverapp.max_body_size, max_buffer_size=serverapp.max_buffer_size
        )
        self.server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}{url_path_join(serverapp.base_url, 'mlx/v1')}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class KernelEnv:
    """Sets the two variables (again once the server is listening) and undoes it on stop."""

    def __init__(self) -> None:
        self._saved: Optional[dict[str, Optional[str]]] = None

    def publish(self, url: Optional[str], key: Optional[str]) -> None:
        if self._saved is None:
            self._saved = {k: os.environ.get(k) for k in (URL_VAR, TOKEN_VAR)}
        for name, value in ((URL_VAR, url), (TOKEN_VAR, key)):
            if value:
                os.environ[name] = value
            else:
                os.environ.pop(name, None)

    def restore(self) -> None:
        if self._saved is None:
            return
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = None
