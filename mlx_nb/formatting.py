"""Formatting shared by the engine's reports, the magics and the widgets (which reach the engine's
data only through the client, so they share this instead of importing the engine)."""

from __future__ import annotations


def human_bytes(n) -> str:
    """1536 -> '1.5 KiB': how the magics and widgets print cache sizes."""
    n = n or 0
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"
