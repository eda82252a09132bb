"""Whether a difference is upstream: the same prompts through mlx_lm's own BatchGenerator, with no
mlx_nb code in between. The same rows differing there means the cause is the model code or
mlx_lm's batching, not ours (we never patch upstream; we record it and batch the safe way)."""

from __future__ import annotations

from typing import Union

from mlx_nb.engine import first_line

WHOLE = 1 << 16  # a prefill chunk larger than any prompt: each prompt read in one piece
RUNS = {  # name -> (prompts prefilled together, prefill chunk)
    "together": (8, None),      # as the engine's batched run: same chunk size
    "alone": (1, None),         # prompts prefilled one at a time, same chunk size
    "alone_whole": (1, WHOLE),  # one at a time, each read in one chunk: only decode is batched
}


def attribute(loaded, prompts: list[list[int]], want: list[list[int]], max_tokens: int, chunk: int,
              runs: tuple) -> dict:
    """run name -> rows that differ from `want` (or the error, one line) for each of `runs`."""
    out: dict[str, Union[list, str]] = {}
    for name in runs:
        batch, step = RUNS[name]
        try:
            rows = batch_generator_rows(loaded, prompts, max_tokens, batch, step or chunk)
            out[name] = [i for i, (got, ref) in enumerate(zip(rows, want)) if got != ref]
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {first_line(exc)}"
    return out


def batch_generator_rows(loaded, prompts: list[list[int]], max_tokens: int, prefill_batch: int, step: int) -> list:
    """Greedy rows from mlx_lm's BatchGenerator, all prompts inserted at once; stop tokens dropped."""
    from mlx_lm.generate import BatchGenerator

    from mlx_nb.engine import responses

    eos = set(loaded.tokenizer.eos_token_ids)
    gen = BatchGenerator(loaded.model, stop_tokens=[[t] for t in eos], prefill_batch_size=prefill_batch,
                         completion_batch_size=max(8, len(prompts)), prefill_step_size=step)
    try:
        uids = gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
        rows: dict[int, list[int]] = {u: [] for u in uids}
        running = set(uids)
        while running:
            for r in responses(gen.next())[1]:
                if r.finish_reason != "stop":
                    rows[r.uid].append(int(r.token))
                if r.finish_reason is not None:
                    running.discard(r.uid)
    finally:
        gen.close()
    return [rows[u] for u in uids]
