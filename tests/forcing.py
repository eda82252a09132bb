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


class ForcedEngine:
    """A real Engine whose every request answers `text` then stops (tiny fixtures: one token per
    byte), for tests that need known model output through Client, magics and widgets."""

    def __init__(self, engine, text: str):
        tok = engine.loaded.tokenizer
        self.engine = engine
        self.ids = tok.encode(text, add_special_tokens=False) + [sorted(tok.eos_token_ids)[0]]

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def submit(self, messages=None, prompt=None, **fields):
        from mlx_nb.engine.submit_request import SubmitRequest

        return self.submit_request(SubmitRequest.of(messages=messages, prompt=prompt, **fields))

    def submit_request(self, req):
        import dataclasses

        budget = dataclasses.replace(req.sampling, max_tokens=len(self.ids))
        return self.engine.submit_request(forced(req, self.ids, sampling=budget))


def forced(req, token_ids: list[int], **changes):
    """The engine request `req`, made to answer `token_ids` (and with `changes`)."""
    import dataclasses

    return dataclasses.replace(req, logits_processors=[*(req.logits_processors or []), forcing(list(token_ids))],
                               **changes)
