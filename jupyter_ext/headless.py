"""`jupyter mlx`: a Jupyter server that serves the model routes and, by default, nothing else.

A stock ServerApp also serves kernels, contents, files and sessions to whoever holds its token or
password, which an inference server has no use for. ModelServerApp keeps only Jupyter's `auth`
(login), `api` (version, status) and `shutdown` (so `jupyter server stop` works) besides the
extension's routes; more of Jupyter's services only when asked:
`jupyter mlx --services=kernels --services=kernelspecs` (`ModelServerApp.jupyter_services`).
Other extensions (JupyterLab, terminals) are not loaded by `jupyter mlx` at all.

This is jupyter-server's own way to narrow a server (`default_services` is the list its
`init_webapp` reads, meant for subclasses to override), not a patch of it.
"""

from __future__ import annotations

from jupyter_server.serverapp import JUPYTER_SERVICE_HANDLERS, ServerApp
from traitlets import List, TraitError, Unicode, validate

BASE_SERVICES = ("auth", "api", "shutdown")


class ModelServerApp(ServerApp):
    jupyter_services = List(
        Unicode(),
        help=f"Jupyter services to serve besides the model routes, from: {', '.join(sorted(JUPYTER_SERVICE_HANDLERS))}.",
    ).tag(config=True)

    @validate("jupyter_services")
    def _known(self, proposal):
        unknown = [s for s in proposal["value"] if s not in JUPYTER_SERVICE_HANDLERS]
        if unknown:
            raise TraitError(f"unknown Jupyter service {', '.join(unknown)}: one of {', '.join(JUPYTER_SERVICE_HANDLERS)}")
        return proposal["value"]

    @property
    def default_services(self) -> tuple:
        return BASE_SERVICES + tuple(s for s in self.jupyter_services if s not in BASE_SERVICES)
