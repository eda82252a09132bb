"""mlx_lm's LoRA adapter folders, read for serving per request.

A folder that `mlx_lm.lora` writes holds `adapter_config.json` (the rank, the scale, which layers)
and `adapters.safetensors` (each adapted projection's `lora_a` [inputs, rank] and `lora_b`
[rank, outputs], named by the projection's path in the model). Serving needs only the pairs and
the scale: `models/lora.py` adds scale * (x A) B to each adapted projection, for the rows that
asked for this adapter. What mlx_lm can train but a shared batch cannot apply per row (DoRA's
rescaled weights, a full fine-tune's replaced weights) is refused here in one line.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CONFIG, WEIGHTS = "adapter_config.json", "adapters.safetensors"


class AdapterError(ValueError):
    """An adapter folder that cannot be served; the message says why and what to do."""


@dataclass
class Adapter:
    """One adapter: its name, where it came from, its scale, and per adapted projection (its path
    in the model, e.g. `model.layers.3.self_attn.q_proj`) the float32 pair (A, B)."""

    name: str
    path: str
    scale: float
    pairs: dict = field(default_factory=dict)  # projection path -> (lora_a, lora_b)
    base_model: str = ""  # the model it was trained on, as its config names it
    held: int = 0  # bytes held once applied: its pairs and the joined pairs the projections use
    # This load's own key: the prefix cache files the adapter's rows under it, so a later load of
    # other weights under the same name never meets the keys and values this one computed.
    key: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def rank(self) -> int:
        return max((int(a.shape[1]) for a, _ in self.pairs.values()), default=0)

    @property
    def nbytes(self) -> int:
        """What it holds: once applied, its pairs and the joined pairs (models/lora.py); before, its pairs."""
        return self.held or sum(a.nbytes + b.nbytes for a, b in self.pairs.values())

    def describe(self) -> dict:
        return {"name": self.name, "path": self.path, "rank": self.rank, "scale": self.scale,
                "projections": len(self.pairs), "bytes": self.nbytes, "base_model": self.base_model}


def is_adapter_dir(path: Path) -> bool:
    return (path / CONFIG).is_file() and (path / WEIGHTS).is_file()


def read_adapter(name: str, path: str) -> Adapter:
    """The adapter in folder `path`, or an AdapterError saying what is wrong with it."""
    import mlx.core as mx

    folder = Path(path).expanduser()
    if not is_adapter_dir(folder):
        raise AdapterError(f"{path} is not an mlx_lm adapter folder: it must hold {CONFIG} and {WEIGHTS} "
                           "(what mlx_lm.lora writes)")
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{folder / CONFIG} cannot be read as JSON: {exc}") from None
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterError(f"adapter {name} is a {kind!r} fine-tune: only LoRA adapters are applied per request "
                           "(fuse it into the model with mlx_lm.fuse and serve that model instead)")
    params = config.get("lora_parameters") or {}
    if "scale" not in params:
        raise AdapterError(f"adapter {name}'s {CONFIG} has no lora_parameters.scale (mlx_lm's name for the "
                           "LoRA multiplier; alpha / rank in other tools): add it")
    try:
        weights = mx.load(str(folder / WEIGHTS))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same mistake to the user
        raise AdapterError(f"{folder / WEIGHTS} cannot be read: {exc}") from None
    halves: dict[str, dict] = {}
    for key, value in weights.items():
        owner, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise AdapterError(f"adapter {name} holds {key}, which is not a LoRA weight (lora_a / lora_b): only "
                               "LoRA adapters are applied per request")
        halves.setdefault(owner, {})[leaf] = value.astype(mx.float32)
    pairs = {}
    for owner, half in sorted(halves.items()):
        a, b = half.get("lora_a"), half.get("lora_b")
        if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise AdapterError(f"adapter {name}'s {owner} needs lora_a [inputs, rank] and lora_b [rank, outputs]")
        pairs[owner] = (a, b)
    if not pairs:
        raise AdapterError(f"adapter {name} holds no LoRA weights")
    mx.eval([p for pair in pairs.values() for p in pair])
    return Adapter(name=name, path=str(folder), scale=float(params["scale"]), pairs=pairs,
                   base_model=str(config.get("model", "")))
