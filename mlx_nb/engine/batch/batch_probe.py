"""A load-time check that a model's prompts prefill together as they do alone, on its own weights.

The compatibility matrix measured each architecture on tiny random instances; a real checkpoint
can differ (a state that reads a batch's left padding only a little on one weight draw, a lot on
another). So before batching a model whose caches are not all plain KV caches, or whose
architecture the matrix has not seen, the engine prefills a few synthetic prompts of different
lengths alone and together, through the same batch generator it serves with, and compares each
prompt's first-token log-probabilities. A difference past `TOLERANCE` means its prompts are
prefilled one at a time. The result is kept per weight fingerprint (`$MLX_NB_HOME`), so a model is
checked once; the check is a handful of short prefill steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Optional

LENGTHS = (3, 9, 17, 33)  # different lengths, so the batch pads; past the tiny fixtures' windows
TOLERANCE = 1e-3  # largest difference of a first-token log-probability that still counts as equal
CACHE_FILE = "batch_checks.json"


def fingerprint(loaded) -> str:
    """A hash of the weights: every parameter's name, shape and dtype and a sample of its values."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    digest = hashlib.sha256(str(loaded.config.get("model_type")).encode())
    for name, p in sorted(tree_flatten(loaded.model.parameters()), key=lambda kv: kv[0]):
        sample = p.reshape(-1)[: 256]
        mx.eval(sample)
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        digest.update(memoryview(sample.astype(mx.float32) if sample.dtype == mx.bfloat16 else sample).tobytes())
    return digest.hexdigest()[:32]


def _prompts(loaded) -> list[list[int]]:
    vocab = loaded.vocab_size or 256
    specials = set(getattr(loaded.tokenizer, "eos_token_ids", []) or [])
    ids = [t for t in range(10, min(vocab, 2000)) if t not in specials]
    return [[ids[(7 * i + 3 * n) % len(ids)] for i in range(n)] for n in LENGTHS]


def _first_logprobs(loaded, prompts: list[list[int]]) -> list:
    """Each prompt's first-token log-probabilities, the prompts read together in one batch."""
    from mlx_nb.engine.batch.decode import Generator
    from mlx_nb.engine.batch.upstream import responses

    gen = Generator(loaded.model, completion_batch_size=len(prompts), prefill_batch_size=len(prompts),
                    prefill_step_size=64)
    try:
        uids = gen.insert(prompts, max_tokens=[1] * len(prompts))
        found: dict = {}
        for _ in range(64 * len(prompts)):
            for r in responses(gen.next())[1]:
                found[r.uid] = r.logprobs
            if len(found) == len(uids):
                return [found[u] for u in uids]
        raise RuntimeError("the batch never produced a first token")
    finally:
        gen.close()


def check(loaded) -> dict:
    """{"agrees", "max_difference", "prompts", "seconds"}: prompts alone against together."""
    import mlx.core as mx

    start = time.perf_counter()
    prompts = _prompts(loaded)
    alone = [_first_logprobs(loaded, [p])[0] for p in prompts]
    together = _first_logprobs(loaded, prompts)
    diff = max(float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)))) for a, b in zip(alone, together))
    return {"agrees": diff <= TOLERANCE, "max_difference": diff, "prompts": [len(p) for p in prompts],
            "seconds": round(time.perf_counter() - start, 2)}


def cached_check(loaded, cache_dir: Optional[Path] = None) -> dict:
    """check(loaded), measured once per weight fingerprint (kept in cache_dir/batch_checks.json)."""
    from mlx_nb.models.sources import models_dir

    path = (cache_dir or models_dir()) / CACHE_FILE
    key = fingerprint(loaded)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return {**known[key], "cached": True}
    result = check(loaded)
    known[key] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, path)
    return {**result, "cached": False}
