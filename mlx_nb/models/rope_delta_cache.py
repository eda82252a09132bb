"""RopeDeltaCache: carries each batch row's mRoPE position delta through mlx_lm's BatchGenerator.

An mRoPE language model (Qwen-VL, GLM-4V) places the tokens after an image at `offset + rope_delta`, where the
delta (usually negative: an image's h x w tokens span fewer positions than tokens) is fixed at
prefill time per request. BatchGenerator knows nothing of it, but it does carry every object of a
request's cache list through merge / filter / extend / extract. So the delta rides along as one
more "layer" cache at the end of the list, with the same verbs as mlx_lm's cache classes, and the
vision adapter reads it back on every forward. It holds no tokens: prepare/finalize are no-ops and
it cannot be trimmed.
"""

from __future__ import annotations

from typing import Optional


class RopeDeltaCache:
    def __init__(self, deltas=None):
        import mlx.core as mx

        # (B, 1) int32, one row per request in the batch; a fresh cache is one text-only row.
        self.deltas = mx.zeros((1, 1), dtype=mx.int32) if deltas is None else deltas.astype(mx.int32).reshape(-1, 1)

    @classmethod
    def of(cls, delta) -> "RopeDeltaCache":
        """One request's cache from its delta (an int or an mx.array holding one value)."""
        import mlx.core as mx

        return cls(mx.array(delta).reshape(1, 1))

    # -- the batching verbs (as in mlx_lm.models.cache) --------------------------------------
    @classmethod
    def merge(cls, caches: list["RopeDeltaCache"]) -> "RopeDeltaCache":
        import mlx.core as mx

        return cls(mx.concatenate([c.deltas for c in caches], axis=0))

    def filter(self, batch_indices) -> None:
        import mlx.core as mx

        self.deltas = self.deltas[mx.array(batch_indices, dtype=mx.int32)]

    def extend(self, other: "RopeDeltaCache") -> None:
        import mlx.core as mx

        self.deltas = mx.concatenate([self.deltas, other.deltas], axis=0)

    def extract(self, idx: int) -> "RopeDeltaCache":
        return RopeDeltaCache(self.deltas[idx : idx + 1])

    def prepare(self, **kwargs) -> None:  # no tokens, so no padding to prepare for
        pass

    def finalize(self) -> None:
        pass

    # -- introspection and persistence -------------------------------------------------------
    @property
    def state(self) -> list:
        return [self.deltas]

    @state.setter
    def state(self, value: list) -> None:
        (self.deltas,) = value

    @property
    def meta_state(self) -> str:
        return ""

    @meta_state.setter
    def meta_state(self, value: Optional[str]) -> None:
        pass

    @classmethod
    def from_state(cls, state: list, meta_state: Optional[str] = None) -> "RopeDeltaCache":
        return cls(state[0])

    @property
    def nbytes(self) -> int:
        return self.deltas.nbytes

    def empty(self) -> bool:
        return self.deltas.shape[0] == 0

    def size(self) -> int:
        return 0

    def is_trimmable(self) -> bool:
        return False

    def trim(self, n: int) -> int:
        return 0

    def __repr__(self) -> str:
        return f"RopeDeltaCache(rows={self.deltas.shape[0]})"
