"""How precisely activations enter the quantized matmuls: one int8 digit a value, or two.

One digit (x ~ d * q, q an int8 per value, a scale per 32) is what llama.cpp computes with; its
dot products are the cheapest, so a 1B model's single stream reads weights near the machine's
bandwidth and batches run twice as fast as with two. Two digits keep ~15 bits of x: small models
are fragile under one (SmolLM2-135M answers "L'Etoile, la Marseillaise..." instead of "Paris", as it
does under llama.cpp), and for them the extra products cost little next to a step's other work.

`MLX_NB_ACTIVATIONS` chooses: `int8` (one digit), `int16` (two), or `auto` (the default): two for
models under 500M matmul weights, one for larger. The choice is per model and fixed at load, so a
row's arithmetic never depends on the batch it is in.
"""

from __future__ import annotations

import os

import mlx.nn as nn

SMALL = 500_000_000  # matmul weights below which `auto` keeps two digits
NAMES = {1: "int8", 2: "int16 (two int8 digits)"}


def digits_for(weights: int) -> int:
    choice = os.environ.get("MLX_NB_ACTIVATIONS", "auto").strip().lower()
    if choice in ("int8", "1"):
        return 1
    if choice in ("int16", "2"):
        return 2
    if choice not in ("auto", ""):
        raise ValueError(f"MLX_NB_ACTIVATIONS must be int8, int16 or auto, not {choice!r}")
    return 2 if weights < SMALL else 1


def set_activation_digits(model: nn.Module) -> str:
    """Give every packed weight of `model` the digits its size calls for; returns their name."""
    from mlx_nb.kernels.layers import Packed

    packed = [m for _, m in model.named_modules() if isinstance(m, Packed)]
    digits = digits_for(sum(m.weights for m in packed))
    for m in packed:
        m.digits = digits
    return NAMES[digits]
