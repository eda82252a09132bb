"""One-request-at-a-time greedy decoding through mlx_lm's own `generate_step`: the yardstick
batched output must equal token for token. Runs on the calling thread, so call it while no
Engine is running."""

from __future__ import annotations


def greedy_alone(loaded, prompt_tokens: list[int], max_tokens: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    eos = set(loaded.tokenizer.eos_token_ids)
    out = []
    for token, _ in generate_step(mx.array(prompt_tokens), loaded.model, max_tokens=max_tokens):
        token = int(token)
        out.append(token)
        if token in eos:
            break
    return out
