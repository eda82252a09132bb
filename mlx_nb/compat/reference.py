"""One-request-at-a-time greedy decoding through mlx_lm's own `generate_step`: the independent
yardstick batched output must equal token for token. Runs on the calling thread, so call it
while no Engine is running (MLX is touched by one thread at a time)."""

from __future__ import annotations


def greedy_alone(loaded, prompt_tokens: list[int], max_tokens: int, cache=None) -> list[int]:
    """The greedy tokens for `prompt_tokens` alone, up to and including an end-of-sequence token
    (starting from the `cache` list given, e.g. mlx_lm's quantized KV caches, else a fresh one)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    eos = set(loaded.tokenizer.eos_token_ids)
    out = []
    for token, _ in generate_step(mx.array(prompt_tokens), loaded.model, max_tokens=max_tokens,
                                      prompt_cache=cache):
        token = int(token)
        out.append(token)
        if token in eos:
            break
    return out


def reply_tokens(loaded, prompt_tokens: list[int], max_tokens: int, cache=None) -> list[int]:
    """What the engine's Result.token_ids must hold: the greedy tokens without the stop token."""
    eos = set(loaded.tokenizer.eos_token_ids)
    return [t for t in greedy_alone(loaded, prompt_tokens, max_tokens, cache) if t not in eos]


def quantized_cache(loaded, bits: int, group_size: int) -> list:
    """mlx_lm's own per-request quantized cache for this model: its QuantizedKVCache in place of each
    plain KVCache (the reference a quantized KV row of the engine must equal)."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    return [QuantizedKVCache(group_size=group_size, bits=bits) if type(c) is KVCache else c
            for c in loaded.make_cache()]
