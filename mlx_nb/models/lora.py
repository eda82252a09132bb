"""LoRA adapters applied per row of a shared batch.

mlx_lm applies an adapter by replacing each adapted projection with `LoRALinear`: y = W x + s (x A) B
for every row, so one loaded model serves one adapter. Here the adapted projections are wrapped
(through MLX's public module API, as `nn.quantize` swaps modules) by a `LoRAProjection` that adds
each adapter's s (x A) B only to the rows that asked for that adapter; rows with another adapter or
none decode in the same forward. Which row wants which adapter is read from the engine's `LoRARouter`
while the batch's forward is built (`adapter_rows`, called by the decode and prompt batches).

The kernels fuse projections (kernels/swap.py): q, k and v are one `qkv`, gate and up one `gate_up`,
and a fused decoder layer hands them the normed input (`norm=`), the down projection the gate's two
halves (`gate=True`) and adds the skip connection inside (`residual=`). An adapter's `q_proj` pair
is therefore applied to the first q outputs of `qkv`, on norm(x); its `down_proj` pair on
silu(gate) * up. Each pair's product is computed as mlx_lm computes it, (x A) B then scaled, per
row, so a row's result does not depend on the other rows in the batch.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from mlx_nb.models.adapters import Adapter, AdapterError


class LoRARouter:
    """The adapters loaded on one model, and which adapter each row of the forward being built
    uses (`adapter_of(uid)`: the name a row's request asked for, or None)."""

    def __init__(self, adapter_of: Callable[[int], Optional[str]]):
        self.adapter_of = adapter_of
        self.adapters: dict[str, Adapter] = {}
        self.current: Optional[list[Optional[str]]] = None  # per row, while a forward is built

    @contextmanager
    def rows(self, uids: list[int]):
        names = [self.adapter_of(u) for u in uids] if self.adapters else []
        self.current = names if any(n is not None for n in names) else None
        try:
            yield
        finally:
            self.current = None


def adapter_rows(model: nn.Module, uids: list[int]):
    """A context in which `model`'s forward gives each row (request uid) its own adapter."""
    router = getattr(model, "lora_router", None)
    return router.rows(uids) if router is not None else nullcontext()


def attach_router(model: nn.Module, adapter_of: Callable[[int], Optional[str]]) -> LoRARouter:
    router = LoRARouter(adapter_of)
    model.lora_router = router  # a plain attribute: not a parameter, not a child module
    return router


class LoRAProjection(nn.Module):
    """A projection plus, for each row of an adapter's requests, that adapter's low-rank terms on
    its slices of the outputs. Called exactly as the projection it wraps (norm / residual / gate)."""

    def __init__(self, base: nn.Module, router: LoRARouter, output_dims: int):
        super().__init__()
        self.base = base
        self.output_dims = output_dims
        object.__setattr__(self, "router", router)
        # adapter name -> (scale, [(start, stop, A, B)] by start): plain attributes, not parameters,
        # so the model's weights (and their fingerprint) stay the base model's
        object.__setattr__(self, "terms", {})
        object.__setattr__(self, "pairs", {})  # adapter name -> (A, B) over every slice it adapts

    def add(self, name: str, scale: float, start: int, stop: int, a: mx.array, b: mx.array) -> None:
        parts = self.terms.setdefault(name, (scale, []))[1]
        parts.append((start, stop, a, b))
        parts.sort(key=lambda p: p[0])
        self.pairs[name] = self._joined(name, parts)

    def remove(self, name: str) -> None:
        del self.terms[name], self.pairs[name]

    def _joined(self, name: str, parts: list) -> tuple[mx.array, mx.array]:
        """One (A, s B) pair for an adapter's slices: A side by side, B block-diagonal at each
        slice's outputs (zeros elsewhere) and scaled, so its term is two matmuls however many
        slices it adapts (each op a decode step adds costs time on a small model)."""
        a = mx.concatenate([p[2] for p in parts], axis=1)
        b = mx.zeros((a.shape[1], self.output_dims), dtype=a.dtype)
        at = 0
        for start, stop, _, part in parts:
            b[at:at + part.shape[0], start:stop] = part
            at += part.shape[0]
        b = self.terms[name][0] * b
        mx.eval(a, b)
        return a, b

    def __call__(self, x: mx.array, norm=None, residual=None, gate: bool = False) -> mx.array:
        given = {"norm": norm, "residual": residual}
        kwargs = {k: v for k, v in given.items() if v is not None}
        if gate:
            kwargs["gate"] = True
        y = self.base(x, **kwargs)
        names = self.router.current
        used = [n for n in self.terms if names is not None and n in names]
        if not used:
            return y
        if x.shape[0] != len(names):
            raise RuntimeError(f"a forward of {x.shape[0]} rows was given adapters for {len(names)}")
        if norm is not None:
            x = norm(x)
        elif gate:
            from mlx_nb.kernels import native

            x = native().silu_gate(x)
        for name in used:
            a, b = self.pairs[name]  # b carries the scale
            rows = [i for i, n in enumerate(names) if n == name]
            if len(rows) == len(names):
                y = y + _as(((x @ a) @ b), y.dtype)
            else:
                idx = mx.array(rows)
                y = y.at[idx].add(_as((x[idx] @ a) @ b, y.dtype))
        return y

    def _extra_repr(self) -> str:
        return f"adapters={sorted(self.terms)}"


def _as(x: mx.array, dtype) -> mx.array:
    return x if x.dtype == dtype else x.astype(dtype)


def _dims(m: nn.Module) -> Optional[tuple[int, int]]:
    """(inputs, outputs) of a projection an adapter can be added to, else None."""
    from mlx_nb.kernels.layers import QLinear, Stacked

    if isinstance(m, LoRAProjection):
        return _dims(m.base)
    if isinstance(m, (QLinear, Stacked)):
        return m.input_dims, m.output_dims
    if isinstance(m, nn.QuantizedLinear):
        return m.weight.shape[1] * 32 // m.bits, m.weight.shape[0]
    if isinstance(m, nn.Linear):
        return m.weight.shape[1], m.weight.shape[0]
    return None


def _locate(modules: dict, owner: str) -> tuple[nn.Module, str, int, int, int]:
    """Where an adapted projection (`owner`, its path in mlx_lm's model) lives in this model:
    (parent module, attribute, first output, end of its outputs, inputs), through the kernels'
    fused projections."""
    from mlx_nb.kernels.layers import Attention, SwiGLU

    parent_path, _, leaf = owner.rpartition(".")
    parent = modules.get(parent_path)
    if parent is None:
        raise AdapterError(f"the model has no {parent_path}")
    if leaf in parent and isinstance(parent[leaf], nn.Module):
        dims = _dims(parent[leaf])
        if dims is None:
            raise AdapterError(f"{owner} is a {type(parent[leaf]).__name__}: only linear projections take an "
                               "adapter per request")
        return parent, leaf, 0, dims[1], dims[0]
    if isinstance(parent, Attention) and leaf in ("q_proj", "k_proj", "v_proj"):
        q, kv = parent.n_heads * parent.head_dim, parent.n_kv_heads * parent.head_dim
        start, stop = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}[leaf]
        return parent, "qkv", start, stop, _dims(parent.qkv)[0]
    if isinstance(parent, SwiGLU) and leaf in ("gate_proj", "up_proj"):
        h = parent.hidden
        start, stop = {"gate_proj": (0, h), "up_proj": (h, 2 * h)}[leaf]
        return parent, "gate_up", start, stop, _dims(parent.gate_up)[0]
    raise AdapterError(f"the model has no {owner}")


def install(model: nn.Module, router: LoRARouter, adapter: Adapter) -> None:
    """Add `adapter` to the model's projections (wrapping each the first time an adapter needs it);
    every pair is checked against the model before anything changes."""
    if adapter.name in router.adapters:
        raise AdapterError(f"an adapter named {adapter.name} is already loaded: unload it first")
    modules = dict(model.named_modules())
    plan = []
    for owner, (a, b) in adapter.pairs.items():
        try:
            parent, attr, start, stop, inputs = _locate(modules, owner)
        except AdapterError as exc:
            raise AdapterError(f"adapter {adapter.name} does not fit this model: {exc}") from None
        if a.shape[0] != inputs or b.shape[1] != stop - start:
            raise AdapterError(f"adapter {adapter.name} does not fit this model: {owner} maps {inputs} inputs to "
                               f"{stop - start} outputs, its pair maps {a.shape[0]} to {b.shape[1]} (an adapter "
                               "trained on another model?)")
        plan.append((parent, attr, start, stop, a, b))
    touched = {}
    for parent, attr, start, stop, a, b in plan:
        current = parent[attr]
        if not isinstance(current, LoRAProjection):
            current = LoRAProjection(current, router, _dims(current)[1])
            setattr(parent, attr, current)
        current.add(adapter.name, adapter.scale, start, stop, a, b)
        touched[id(current)] = current
    joined = sum(a.nbytes + b.nbytes for m in touched.values() for a, b in [m.pairs[adapter.name]])
    adapter.held = adapter.nbytes + joined  # what the memory budget counts
    router.adapters[adapter.name] = adapter


def uninstall(model: nn.Module, router: LoRARouter, name: str) -> Adapter:
    """Take adapter `name` off the model; a projection no adapter needs any more is unwrapped."""
    adapter = router.adapters.pop(name)
    for _, module in list(model.named_modules()):
        for attr, child in list(module.items()):
            if isinstance(child, LoRAProjection) and name in child.terms:
                child.remove(name)
                if not child.terms:
                    setattr(module, attr, child.base)
    return adapter
