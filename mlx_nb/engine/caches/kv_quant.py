"""A quantized KV cache that batches: 8- or 4-bit keys and values as rows of the shared batch.

mlx_lm's `QuantizedKVCache` holds one request's keys and values as MLX's affine quantization
(packed uint32 words, and a scale and bias per group of `group_size` values along the head
dimension), and its attention (`mlx_lm.models.base.scaled_dot_product_attention`, which every
mlx_lm model calls) reads them with `mx.quantized_matmul` whenever the cache has `bits`. It has no
batch form, so mlx_lm's BatchGenerator cannot merge it and such a model was served one request at
a time. Here:

- `QuantizedKV`: mlx_lm's per-request cache plus `merge`, which is what BatchGenerator calls to
  put requests' caches into one batch (`_merge_caches`).
- `BatchQuantizedKV`: mlx_lm's `BatchKVCache` (left padding, the causal mask it builds, trim) over
  the three quantized arrays. Quantization groups run along the head dimension, so every batch
  operation (merge, filter, extend, the right-padding roll, extract) is the float cache's operation
  on the batch and token axes, applied to each of the three arrays. Padding is all-zero words,
  scales and biases: it dequantizes to zeros, and the mask skips it.
- `KVQuantization`: a server's or model's setting; it makes each request's cache and converts a
  float cache handed in (a vision prefill, a prefix-cache file written without quantization).

Only plain KV layers are quantized; a sliding-window or SSM layer stays as the model made it.
Keys and values are quantized as they are written, the prompt's too, as mlx_lm's QuantizedKVCache
does from its first token: a row's tokens are those of mlx_lm's `generate_step` given that cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, dynamic_roll

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)


def _map(fn, arrays):
    return tuple(fn(a) for a in arrays)


class QuantizedKV(QuantizedKVCache):
    """One request's quantized keys and values (mlx_lm's QuantizedKVCache) that can join a batch."""

    def merge(self, caches: list) -> "BatchQuantizedKV":
        return BatchQuantizedKV.merge(caches)

    def size(self) -> int:
        return self.offset

    @classmethod
    def of(cls, cache, group_size: int, bits: int) -> "QuantizedKV":
        """This layer's keys and values, quantized: a float KVCache is quantized up to its offset;
        mlx_lm's own QuantizedKVCache of the same setting is taken as it is."""
        out = cls(group_size=group_size, bits=bits)
        out.offset = cache.offset
        if isinstance(cache, QuantizedKVCache):
            if (cache.group_size, cache.bits) != (group_size, bits):
                raise ValueError(f"a {cache.bits}-bit KV cache (group {cache.group_size}) cannot join "
                                 f"a {bits}-bit batch (group {group_size})")
            out.keys, out.values = cache.keys, cache.values
        elif cache.keys is not None:
            n = cache.offset
            out.keys = mx.quantize(cache.keys[..., :n, :], group_size=group_size, bits=bits)
            out.values = mx.quantize(cache.values[..., :n, :], group_size=group_size, bits=bits)
        return out


class BatchQuantizedKV(BatchKVCache):
    """mlx_lm's BatchKVCache whose keys and values are (words, scales, biases) triples; `bits` and
    `group_size` make mlx_lm's attention read them quantized (see the module docstring)."""

    def __init__(self, left_padding: list, group_size: int = 64, bits: int = 8):
        super().__init__(left_padding)
        self.group_size, self.bits = group_size, bits

    # -- writing ------------------------------------------------------------------------------
    def _zeros(self, B: int, H: int, T: int, dims: int, dtype) -> tuple:
        per_word = 32 // self.bits
        return (mx.zeros((B, H, T, dims // per_word), dtype=mx.uint32),
                mx.zeros((B, H, T, dims // self.group_size), dtype=dtype),
                mx.zeros((B, H, T, dims // self.group_size), dtype=dtype))

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            B, H = keys.shape[:2]
            grow = (self.step + n - 1) // self.step * self.step
            new_k = self._zeros(B, H, grow, keys.shape[3], keys.dtype)
            new_v = self._zeros(B, H, grow, values.shape[3], values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                if prev % self.step != 0:
                    self.keys, self.values = (_map(lambda a: a[..., :prev, :], t) for t in (self.keys, self.values))
                self.keys = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k))
                self.values = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v))
        self.offset = self.offset + n
        self._idx += n
        for stored, new in ((self.keys, keys), (self.values, values)):
            for a, q in zip(stored, mx.quantize(new, group_size=self.group_size, bits=self.bits)):
                a[..., prev:self._idx, :] = q
        return self.keys_and_values()

    def keys_and_values(self):
        return tuple(_map(lambda a: a[..., :self._idx, :], t) for t in (self.keys, self.values))

    def finalize(self):
        if self._right_padding is not None:
            shift = self._right_padding[:, None]
            self.keys, self.values = (_map(lambda a: dynamic_roll(a, shift, axis=2), t)
                                      for t in (self.keys, self.values))
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    # -- rows leaving and joining ---------------------------------------------------------------
    def filter(self, batch_indices):
        if self.keys is not None:
            self.keys, self.values = (_map(lambda a: a[batch_indices], t) for t in (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.keys is not None:
                self.keys, self.values = (_map(lambda a: a[..., shift:, :], t) for t in (self.keys, self.values))
            self._idx -= shift
            self.left_padding -= shift

    def extend(self, other: "BatchQuantizedKV"):
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        shaped = self if self.keys is not None else other
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def aligned(c):  # right-justified at `idx`, `size` long
            rows = c.offset.shape[0]
            if c.keys is None:
                empty = [_map(lambda a: mx.zeros((rows, *a.shape[1:2], 0, a.shape[3]), dtype=a.dtype), t)
                         for t in (shaped.keys, shaped.values)]
            else:
                empty = [c.keys, c.values]
            left = idx - c._idx
            right = size - empty[0][0].shape[2] - left

            def fit(a):
                if right < 0:
                    a = a[..., :right, :]
                if left or right > 0:
                    a = mx.pad(a, [(0, 0), (0, 0), (left, max(right, 0)), (0, 0)])
                return a

            return [_map(fit, t) for t in empty], c.offset, c.left_padding + left

        (ka, va), oa, pa = aligned(self)
        (kb, vb), ob, pb = aligned(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(ka, kb))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(va, vb))
        self.offset, self.left_padding = mx.concatenate([oa, ob]), mx.concatenate([pa, pb])
        self._idx = idx

    def extract(self, idx: int) -> QuantizedKV:
        out = QuantizedKV(group_size=self.group_size, bits=self.bits)
        pad = self.left_padding.tolist()[idx]
        out.keys, out.values = (_map(lambda a: mx.contiguous(a[idx:idx + 1, :, pad:self._idx]), t)
                                for t in (self.keys, self.values))
        out.offset = self._idx - pad
        return out

    @classmethod
    def merge(cls, caches: list) -> "BatchQuantizedKV":
        """One batch from requests' caches (QuantizedKV, or a float KVCache, quantized here)."""
        setting = next((c for c in caches if isinstance(c, QuantizedKVCache)), None)
        if setting is None:
            raise ValueError("a quantized KV batch needs the setting of at least one QuantizedKV cache")
        group_size, bits = setting.group_size, setting.bits
        caches = [c if isinstance(c, QuantizedKV) else QuantizedKV.of(c, group_size, bits) for c in caches]
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls([0] * len(caches), group_size, bits)
        padding = [longest - n for n in lengths]
        first = next(c for c in caches if c.keys is not None)
        B, H = len(caches), first.keys[0].shape[1]
        per_word = 32 // bits
        out = cls(padding, group_size, bits)
        keys = out._zeros(B, H, longest, first.keys[0].shape[3] * per_word, first.keys[1].dtype)
        values = out._zeros(B, H, longest, first.values[0].shape[3] * per_word, first.values[1].dtype)
        for i, (p, c) in enumerate(zip(padding, caches)):
            if c.keys is None:
                continue
            for stored, own in ((keys, c.keys), (values, c.values)):
                for a, b in zip(stored, own):
                    a[i:i + 1, :, p:p + c.offset] = b[..., :c.offset, :]
        out.keys, out.values = keys, values
        out.offset = out.offset + longest
        out._idx = longest
        return out

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(a.nbytes for t in (self.keys, self.values) for a in t)


@dataclass(frozen=True)
class KVQuantization:
    """A KV cache setting: `bits` (8 or 4) per value plus a scale and bias per `group_size` values."""

    bits: int
    group_size: int = 64

    def __post_init__(self):
        if type(self.bits) is not int or self.bits not in BITS:
            raise ValueError(f"kv_bits must be one of {BITS} (or None for float keys and values), not {self.bits!r}")
        if type(self.group_size) is not int or self.group_size not in GROUP_SIZES:
            raise ValueError(f"kv_group_size must be one of {GROUP_SIZES}, not {self.group_size!r}")

    @classmethod
    def parse(cls, bits: Optional[int], group_size: int = 64) -> Optional["KVQuantization"]:
        return None if bits is None or (type(bits) is int and bits == 0) else cls(bits, group_size)

    @property
    def label(self) -> str:
        return f"q{self.bits}g{self.group_size}"

    def applies(self, layer) -> bool:
        """A plain KV layer (mlx_lm's KVCache, not a window or SSM state) or a quantized one."""
        return type(layer) is KVCache or isinstance(layer, QuantizedKVCache)

    def convert(self, cache: list) -> list:
        """A request's cache list with its plain KV layers quantized (a new list; others kept)."""
        return [QuantizedKV.of(c, self.group_size, self.bits) if self.applies(c) else c for c in cache]

    def fits(self, head_dims: list[int]) -> Optional[str]:
        """Why this setting cannot hold heads of these sizes, or None."""
        bad = sorted({d for d in head_dims if d % self.group_size})
        if not bad:
            return None
        fitting = [str(g) for g in GROUP_SIZES if all(d % g == 0 for d in head_dims)]
        advice = f"use kv_group_size {' or '.join(fitting)}" if fitting else \
            f"quantized KV needs heads of a multiple of {GROUP_SIZES[0]}"
        return f"kv_group_size {self.group_size} does not divide the head size {bad[0]}: {advice}"


def kv_setting(loaded, kv_bits: Optional[int], kv_group_size: int = 64) -> tuple[Optional[KVQuantization], Optional[str]]:
    """The KV quantization this loaded model runs with, and why not when it was asked for and cannot:
    a vision model keeps float keys and values (mlx_vlm's prefill writes them), a model with no plain KV
    layer has nothing to quantize, and a model whose attention does not read a quantized cache (one
    token through the model with one shows it at load) or whose heads the group size does not divide
    keeps float keys and values. The server goes on serving in every case; `status()` says which."""
    setting = KVQuantization.parse(kv_bits, kv_group_size)
    if setting is None:
        return None, None
    if loaded.kind != "text":
        return None, "a vision model keeps float keys and values"
    fresh = loaded.make_cache()
    if not any(setting.applies(c) for c in fresh):
        return None, "this model has no plain KV layer to quantize (sliding windows and SSM state stay float)"
    probe = loaded.make_cache()
    try:
        loaded.model(mx.array([[0]]), cache=probe)
        dims = [d for c in probe if setting.applies(c) and c.keys is not None
                for d in (c.keys.shape[-1], c.values.shape[-1])]
        wrong = setting.fits(dims)
        if wrong:
            return None, wrong
        mx.eval(loaded.model(mx.array([[0]]), cache=setting.convert(fresh)))
    except Exception as exc:  # its attention reads keys as one array
        from mlx_nb.engine.types import first_line

        return None, f"this model's attention cannot read a quantized cache ({type(exc).__name__}: {first_line(exc)})"
    return setting, None


def fresh_cache(loaded, setting: Optional[KVQuantization]) -> list:
    """A new request's cache list for this model under this setting (None: as the model makes it)."""
    return loaded.make_cache() if setting is None else setting.convert(loaded.make_cache())


def kv_status(setting: Optional[KVQuantization], note: Optional[str]) -> dict:
    """What `status()["kv_cache"]` says: the bits and group size (None for float), and why float if
    a setting was asked for and does not apply."""
    out = {"bits": None, "group_size": None} if setting is None else {"bits": setting.bits,
                                                                       "group_size": setting.group_size}
    return {**out, "note": note} if note else out


def upstream_form(cache: list) -> list:
    """The cache list with each QuantizedKV as mlx_lm's own QuantizedKVCache (the same arrays), the
    class mlx_lm's prompt-cache files name and its loader rebuilds."""
    out = []
    for layer in cache:
        if isinstance(layer, QuantizedKV):
            plain = QuantizedKVCache(group_size=layer.group_size, bits=layer.bits)
            plain.keys, plain.values, plain.offset = layer.keys, layer.values, layer.offset
            layer = plain
        out.append(layer)
    return out
