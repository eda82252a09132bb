"""Reading GGUF metadata as plain Python, and the error every GGUF problem raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the one-line message says what is wrong and what to do."""


def value(v: Any) -> Any:
    """Metadata as plain Python: `mx.load` returns numbers as mx arrays and string arrays as lists."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    return v


def meta(src: Path, meta: dict, key: str, default: Any = ...) -> Any:
    if key in meta:
        return value(meta[key])
    if default is ...:
        raise GGUFError(f"{src} has no {key} metadata (not a complete llama.cpp model file): pass another file")
    return default


def corrupt(src: Path, what: str) -> GGUFError:
    return GGUFError(
        f"{src} is not a valid GGUF file (truncated or corrupt: {what}): re-download it or pass another file"
    )
