"""A logits processor that dictates the tokens: for tests that need a known output from a random model."""


def forcing(token_ids: list[int]):
    """A logits processor that makes the model emit exactly `token_ids`, one per step."""
    import mlx.core as mx

    state = {"i": 0}

    def processor(tokens, logits):
        target = token_ids[min(state["i"], len(token_ids) - 1)]
        state["i"] += 1
        mask = mx.arange(logits.shape[-1]) == target  # logits are one row: (1, vocab)
        return mx.where(mask[None], 0.0, -1e9).astype(logits.dtype)

    return processor
