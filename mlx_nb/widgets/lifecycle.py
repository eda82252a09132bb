"""Re-running a notebook cell closes the live widgets its previous run made.

A live widget holds a thread and (over HTTP) an events connection. Re-running its cell makes a
new one, and the old one, no longer shown anywhere, would keep both until the kernel dies.
JupyterLab and Notebook 7 send the cell's id in each execute request's metadata (`cellId`), so
each live widget is recorded under the cell and the request that made it: a later request from
the same cell closes what the earlier ones made. Widgets made outside a cell (scripts, terminal
IPython, nbclient without cell ids) are left to their owner's `close()`.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

_lock = threading.Lock()
_by_cell: dict[str, tuple[str, list]] = {}  # cell id -> (the request that made them, widgets)


def current_cell() -> tuple[Optional[str], Optional[str]]:
    """(cell id, execute request id) of the cell running now, or (None, None)."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        parent = kernel.get_parent("shell") if kernel is not None else {}
    except Exception:
        return None, None
    cell = (parent.get("metadata") or {}).get("cellId")
    return cell, (parent.get("header") or {}).get("msg_id")


def adopt(widget: Any, cell: Optional[str] = None, request: Optional[str] = None) -> None:
    """Record `widget` under its cell, first closing what earlier runs of that cell made."""
    if cell is None:
        cell, request = current_cell()
    if cell is None:
        return
    with _lock:
        made_by, widgets = _by_cell.get(cell, (None, []))
        stale = widgets if made_by != request else []
        _by_cell[cell] = (request, [] if stale else widgets)
        _by_cell[cell][1].append(widget)
    for old in stale:
        if old is not widget:
            try:
                old.close()
            except Exception:  # an already broken widget: nothing left to stop
                pass
