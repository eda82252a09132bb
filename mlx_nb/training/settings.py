"""A fine-tune's settings: what is trained, how hard, how often it is measured and kept.

The defaults are mlx_lm.lora's (rank 8, scale 20, the last 16 layers, batch 4, Adam) except the
learning rate: mlx_lm's 1e-5 is made for thousands of steps, and a notebook fine-tune runs tens to
hundreds, so 2e-4 (with its warning: past ~5e-4 a 135M model's loss can blow up). Checkpoints and
validation share one cadence, so a job resumed from a checkpoint measures at the same steps as one
that never stopped.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Optional

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
METHODS = ("lora",)


@dataclass
class TrainSettings:
    base: str
    name: str
    method: str = "lora"
    rank: int = 8
    scale: float = 20.0
    dropout: float = 0.0
    num_layers: int = 16  # the last N layers get adapters; -1 for all
    keys: Optional[list] = None  # which projections (mlx_lm's per-family default when None)
    iters: Optional[int] = None  # None: one pass over the training rows (at least 20 steps)
    learning_rate: float = 2e-4
    batch_size: int = 4
    mask_prompt: bool = True
    max_seq_length: int = 2048
    truncate: bool = False  # rows longer than max_seq_length: cut (True) or refused (False)
    steps_per_save: int = 50  # a checkpoint (served as name:step-N) and a validation every this many steps
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def check(self) -> "TrainSettings":
        """Self, or a ValueError naming the first setting out of range and what it may be."""
        if not NAME.match(self.name or ""):
            raise ValueError(f"name {self.name!r} must be 1-64 letters, digits, '_', '-' or '.', starting with a "
                             "letter or digit (it becomes base@name)")
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not trained here: use 'lora' (DoRA adapters cannot be "
                             "served per request beside the base model)")
        for key in ("rank", "batch_size", "steps_per_save", "max_seq_length"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} must be at least 1, not {getattr(self, key)}")
        if self.iters is not None and int(self.iters) < 1:
            raise ValueError(f"iters must be at least 1, not {self.iters}")
        if not 0 < float(self.learning_rate) < 1:
            raise ValueError(f"learning_rate must be between 0 and 1, not {self.learning_rate}")
        if not 0 <= float(self.dropout) < 1:
            raise ValueError(f"dropout must be in [0, 1), not {self.dropout}")
        if int(self.num_layers) == 0 or int(self.num_layers) < -1:
            raise ValueError(f"num_layers must be a positive count or -1 (all), not {self.num_layers}")
        return self

    def steps(self, train_rows: int) -> int:
        return int(self.iters) if self.iters is not None else max(20, train_rows // self.batch_size)

    def adapter_config(self, layers: int) -> dict:
        """What mlx_lm writes beside an adapter (adapter_config.json), so mlx_lm loads ours too."""
        params = {"rank": self.rank, "scale": self.scale, "dropout": self.dropout}
        if self.keys:
            params["keys"] = list(self.keys)
        return {"fine_tune_type": self.method, "num_layers": layers, "lora_parameters": params,
                "model": self.base, "mask_prompt": self.mask_prompt, "batch_size": self.batch_size,
                "learning_rate": self.learning_rate, "seed": self.seed}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainSettings":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training setting(s) {', '.join(unknown)}: use {', '.join(sorted(known))}")
        return cls(**values)
