"""MLX_NB_URL / MLX_NB_TOKEN in the server's environment, so the kernels it starts find the engine.

Local kernels inherit the server process's environment (jupyter_client copies `os.environ` when it
launches one), so setting these two variables here is all it takes for `mlx_nb.Client()` in any
notebook of this server to talk to the shared engine instead of loading its own. The token is the
server's own: kernels run as the server's user and can already read its runtime files, so this
grants them nothing new. Previous values are restored when the extension stops.
"""

from __future__ import annotations

import os
from typing import Optional

from jupyter_server.utils import url_path_join

URL_VAR = "MLX_NB_URL"
TOKEN_VAR = "MLX_NB_TOKEN"
_LOOPBACK = {"": "127.0.0.1", "localhost": "127.0.0.1", "0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "::": "[::1]"}


def api_url(serverapp) -> Optional[str]:
    """`http://127.0.0.1:<port><base_url>mlx/v1`, as a kernel on this machine reaches it.

    Kernels are local, so a wildcard or `localhost` bind is reached over loopback (the server
    binds loopback for `localhost` too). None for a Unix-socket server: no plain HTTP URL exists.
    """
    if getattr(serverapp, "sock", ""):
        return None
    ip = serverapp.ip or ""
    host = _LOOPBACK.get(ip, f"[{ip}]" if ":" in ip else ip)
    scheme = "https" if serverapp.certfile else "http"
    return f"{scheme}://{host}:{serverapp.port}{url_path_join(serverapp.base_url, 'mlx/v1')}"


class KernelEnv:
    """Sets the two variables (again whenever the port may have changed) and undoes it on stop."""

    def __init__(self) -> None:
        self._saved: Optional[dict[str, Optional[str]]] = None

    def publish(self, serverapp) -> Optional[str]:
        if self._saved is None:
            self._saved = {k: os.environ.get(k) for k in (URL_VAR, TOKEN_VAR)}
        url = api_url(serverapp)
        token = serverapp.identity_provider.token or ""
        for key, value in ((URL_VAR, url), (TOKEN_VAR, token)):
            if value:
                os.environ[key] = value
            else:
                os.environ.pop(key, None)
        return url

    def restore(self) -> None:
        if self._saved is None:
            return
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = None
