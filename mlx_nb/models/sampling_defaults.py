"""A model's own recommended sampling, from its `generation_config.json` (as vLLM's
`--generation-config auto` reads it): what requests that leave a setting out get.

Only the sampling values are read (temperature, top_p, top_k, min_p, repetition_penalty), each
kept only when it is a number in the range a request may send. A built-in model without such a file
gets the values its model card recommends.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("mlx_nb")

# The model card of SmolLM2-135M-Instruct samples with temperature 0.2, top_p 0.9; at the APIs'
# temperature 1.0 it rambles to the end of the context on a third of simple questions.
BUILT_IN = {"smollm2-135m-instruct": {"temperature": 0.2, "top_p": 0.9}}

_RANGES = {
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 1e-9, 1.0),
    "top_k": (int, 0, 1 << 20),
    "min_p": (float, 0.0, 1.0),
    "repetition_penalty": (float, 1e-9, 10.0),
}


def read(name: str, path: Path) -> dict:
    """{"values": {...}, "source": where they came from} ({} values when the model says nothing)."""
    file = Path(path) / "generation_config.json"
    try:
        config = json.loads(file.read_text()) if file.exists() else {}
    except (OSError, ValueError) as exc:
        log.warning("mlx_nb: %s is unreadable (%s); no model sampling defaults", file, exc)
        config = {}
    values = {}
    for key, (kind, low, high) in _RANGES.items():
        v = config.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if kind is int and v != int(v):
            continue
        if low <= v <= high:
            values[key] = kind(v)
    if values:
        return {"values": values, "source": "generation_config.json"}
    if name in BUILT_IN:
        return {"values": dict(BUILT_IN[name]), "source": "built-in (the model card's recommendation)"}
    return {"values": {}, "source": None}
