"""The engine's settings as `c.MLXExtension.*` traits, generated from EngineConfig (mlx_nb/engine/config.py).

Each EngineConfig field the server exposes becomes a trait of the same name, type, default and help,
so the server, `Engine(...)` and the settings page cannot disagree. The few settings whose meaning
on a server differs (per-model `draft_models` for `draft_model`, `image_roots` defaulting to the
server's root, `prefix_cache_dir` defaulting to a folder under $MLX_NB_HOME) are the extension's own
traits; `engine_kwargs` maps all of them back to Engine's keywords.
"""

from __future__ import annotations

import typing
from typing import Any

from traitlets import Bool, Float, HasTraits, Int, Unicode

from mlx_nb.engine import settings_rows


def _trait(hint: Any, default: Any, help: str):
    optional = type(None) in typing.get_args(hint)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    kind = {bool: Bool, int: Int, float: Float, str: Unicode}.get(base)
    if kind is None:
        raise TypeError(f"no trait for a setting of type {hint!r}: add one to jupyter_ext/settings.py")
    return kind(default, allow_none=optional, help=help).tag(config=True)


def engine_traits() -> dict:
    """{name: trait} for every EngineConfig setting the server exposes."""
    return {r["name"]: _trait(r["type"], r["default"], r["help"]) for r in settings_rows() if r["server"]}


_TRAITS = engine_traits()
SERVER_ENGINE_SETTINGS = tuple(_TRAITS)

# The engine's settings as traits; MLXExtension inherits them (c.MLXExtension.max_batch = 8).
EngineTraits = type("EngineTraits", (HasTraits,), {"__doc__": "The engine's settings (EngineConfig).", **_TRAITS})


def engine_kwargs(app, **own: Any) -> dict:
    """Engine's keyword arguments from `app`'s traits, with `own` (the server-specific ones) over them."""
    return {**{name: getattr(app, name) for name in SERVER_ENGINE_SETTINGS}, **own}
