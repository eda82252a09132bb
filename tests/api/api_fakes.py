"""Deltas and Results built by hand, shaped as the engine produces them (no engine needed)."""

from mlx_nb.engine.types import Delta, Result, TokenLogprob, Usage

USAGE = Usage(prompt_tokens=12, completion_tokens=5, cached_tokens=4)


def deltas(pieces, finish="stop", rid="req-1", usage=USAGE, logprobs=None):
    """One Delta per text piece; the last carries finish_reason and usage, as the engine's do."""
    out = [Delta(rid, text=p, logprobs=list(logprobs[i]) if logprobs else []) for i, p in enumerate(pieces)]
    out.append(Delta(rid, finish_reason=finish, usage=usage))
    return out


def result(text, finish="stop", rid="req-1", usage=USAGE, logprobs=None, error=None):
    return Result(rid, text=text, finish_reason=finish, usage=usage, logprobs=logprobs or [], error=error)


def lp(token, logprob=-0.5, top=()):
    return TokenLogprob(token, logprob, list(top))


def feed_all(stream, ds, **kw):
    out = []
    for d in ds:
        out.extend(stream.feed(d, **kw))
    return out
