"""The `/v1/models` body: the names the engine can serve, in OpenAI's list shape."""

from __future__ import annotations

from typing import Iterable


def model_card(name: str, *, created: int = 0, owned_by: str = "mlx-nb") -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": owned_by}


def models_list(names: Iterable[str], *, created: int = 0, owned_by: str = "mlx-nb") -> dict:
    return {"object": "list", "data": [model_card(n, created=created, owned_by=owned_by) for n in names]}
