"""Per-request samplers and logits processors, built on mlx_lm's sample_utils.

A `TokenSampler` holds a request's settings. Called on log-probabilities it samples as mlx_lm's
`make_sampler` would (on the CPU kernels when they are built); our decode step (`decode.py`) instead
samples every row of the batch that has one in a single kernel call, from the raw logits.
Unseeded requests with equal settings share one sampler object. A seeded request gets its own
random key stream, so its output does not depend on what else is in the batch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from mlx_nb.engine.types import RequestError, SamplingParams


def validate(p: SamplingParams, vocab_size: Optional[int] = None) -> None:
    """Refuse settings no request could mean. A budget beyond the context is not refused: the
    engine clamps it to what fits after the prompt."""
    bias_ok = isinstance(p.logit_bias, dict) and len(p.logit_bias) <= 300 and all(
        isinstance(t, int) and 0 <= t < (vocab_size or t + 1) and isinstance(b, (int, float)) and -100 <= b <= 100
        for t, b in p.logit_bias.items()
    )
    checks = [
        (isinstance(p.max_tokens, int) and p.max_tokens >= 1, "max_tokens", "max_tokens must be a positive integer"),
        (0.0 <= p.temperature <= 10.0, "temperature", "temperature must be between 0 and 10"),
        (0.0 < p.top_p <= 1.0, "top_p", "top_p must be in (0, 1]"),
        (isinstance(p.top_k, int) and p.top_k >= 0, "top_k", "top_k must be a non-negative integer"),
        (0.0 <= p.min_p <= 1.0, "min_p", "min_p must be between 0 and 1"),
        (0.0 < p.repetition_penalty <= 10.0, "repetition_penalty", "repetition_penalty must be in (0, 10]"),
        (-2.0 <= p.presence_penalty <= 2.0, "presence_penalty", "presence_penalty must be between -2 and 2"),
        (-2.0 <= p.frequency_penalty <= 2.0, "frequency_penalty", "frequency_penalty must be between -2 and 2"),
        (bias_ok, "logit_bias",
         f"logit_bias must map at most 300 token ids (0 to {(vocab_size or 0) - 1}) to biases from -100 to 100"),
        (isinstance(p.logprobs, int) and 0 <= p.logprobs <= 20, "logprobs", "logprobs must be an integer from 0 to 20"),
        (isinstance(p.stop, list) and all(isinstance(s, str) and s for s in p.stop) and len(p.stop) <= 16,
         "stop", "stop must be a list of at most 16 non-empty strings"),
        (p.seed is None or isinstance(p.seed, int), "seed", "seed must be an integer"),
    ]
    for ok, field, message in checks:
        if not ok:
            raise RequestError(message, field)


class TokenSampler:
    """A request's sampling settings as an mlx_lm sampler (`sampler(logprobs) -> token ids`), plus
    what the decode step reads: the settings, whether the request wants log-probabilities, and its
    uniform draws (from its own key when seeded)."""

    def __init__(self, p: SamplingParams, seeded: bool):
        self.temperature, self.top_p, self.top_k, self.min_p = p.temperature, p.top_p, p.top_k, p.min_p
        self.wants_logprobs = p.logprobs > 0
        self._key = None
        if seeded:
            import mlx.core as mx

            self._key = mx.random.key(p.seed)
        self._mlx = None

    @property
    def seeded(self) -> bool:
        return self._key is not None

    def uniform(self, n: int):
        """n uniform numbers in [0, 1): from this request's key stream when seeded."""
        import mlx.core as mx

        if self._key is None:
            return mx.random.uniform(shape=(n,))
        self._key, sub = mx.random.split(self._key)
        return mx.random.uniform(shape=(n,), key=sub)

    def __call__(self, logprobs):
        import mlx.core as mx

        from mlx_nb.kernels import ops

        if self.temperature == 0:
            return mx.argmax(logprobs, axis=-1)
        rows = logprobs.shape[0]
        full = lambda v, dtype=mx.float32: mx.full((rows,), v, dtype=dtype)  # noqa: E731
        return ops.sample(logprobs, temperature=full(self.temperature), top_p=full(self.top_p),
                          top_k=full(self.top_k, mx.int32), min_p=full(self.min_p),
                          uniform=lambda: self.uniform(rows), fallback=lambda: self._fallback(logprobs))

    def _filtered(self, logprobs):
        """The log-probabilities mlx_lm's sampler draws from (before the temperature): top-p, min-p
        and top-k applied in its order."""
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs

    def distribution(self, logprobs):
        """Each row's probabilities of the next token under these settings (a sampled request)."""
        import mlx.core as mx

        return mx.softmax(self._filtered(logprobs) * (1.0 / self.temperature), axis=-1, precise=True)

    def _fallback(self, logprobs):
        """mlx_lm's own sampler for these settings (MLX ops), with this request's key when seeded."""
        import mlx.core as mx
        from mlx_lm.sample_utils import make_sampler

        if self._key is None:
            if self._mlx is None:
                self._mlx = make_sampler(temp=self.temperature, top_p=self.top_p, min_p=self.min_p, top_k=self.top_k)
            return self._mlx(logprobs)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(self._filtered(logprobs) * (1.0 / self.temperature), key=sub)


class SamplerCache:
    """Hands out shared samplers by setting; seeded requests get a private one. Holds the
    `capacity` most recently used settings, so clients sweeping temperatures can't grow it."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._shared: OrderedDict[tuple, TokenSampler] = OrderedDict()

    def get(self, p: SamplingParams) -> TokenSampler:
        if p.seed is not None and p.temperature > 0:
            return TokenSampler(p, seeded=True)
        key = p.sampler_key()
        if key in self._shared:
            self._shared.move_to_end(key)
        else:
            self._shared[key] = TokenSampler(p, seeded=False)
            while len(self._shared) > self.capacity:
                self._shared.popitem(last=False)
        return self._shared[key]

    def __len__(self) -> int:
        return len(self._shared)


def logits_processors(p: SamplingParams, extra: Optional[list] = None) -> list:
    """The caller's processors, then mlx_lm's for bias and penalties (only those that are set)."""
    from mlx_lm.sample_utils import make_logits_processors

    return list(extra or []) + make_logits_processors(
        logit_bias=p.logit_bias or None,
        repetition_penalty=p.repetition_penalty if p.repetition_penalty != 1.0 else None,
        presence_penalty=p.presence_penalty or None,
        frequency_penalty=p.frequency_penalty or None,
    )
