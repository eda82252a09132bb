"""What an 8-bit KV cache costs the default model: a long conversation read with its keys and values
quantized, as a row of a batch beside a left-padded second conversation, scores the same perplexity
(within 1%) as with float keys and values, in at most 55% of the bytes; and chats served with it
concurrently each equal mlx_lm's generate_step alone with its QuantizedKVCache on the same model.

bench/kv_quant.py measures the same at 16k tokens (bench/results/kv_quant.md); the suite reads 2k."""

import math
import random
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import BatchKVCache

from mlx_nb import Engine
from mlx_nb.compat.reference import quantized_cache, reply_tokens
from mlx_nb.engine.caches.kv_quant import BatchQuantizedKV
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.models import load_model

MODEL = "smollm2-135m-instruct"
TEXT = Path(__file__).parents[2] / "bench" / "data" / "quality_text.txt"
CHUNK = 512


def conversation(tokenizer, n: int, seed: int) -> list[int]:
    """n tokens of a chat whose turns are paragraphs of the repo's fixed text, drawn at random."""
    paragraphs = [p for p in TEXT.read_text().split("\n\n") if p.strip()]
    rng = random.Random(seed)
    turns, ids = [], []
    while len(ids) < n:
        turns.append({"role": ("user", "assistant")[len(turns) % 2], "content": "\n\n".join(rng.sample(paragraphs, 3))})
        ids = tokenizer.apply_chat_template(turns, tokenize=True)
    return list(ids[:n])


def read(model, rows: list[list[int]], caches: list) -> tuple[float, int]:
    """Row 0's perplexity, reading all rows (right-aligned, left-padded) chunk by chunk into `caches`;
    and the bytes the caches hold."""
    n = max(len(r) for r in rows)
    x = mx.array([[0] * (n - len(r)) + r for r in rows])
    nll = 0.0
    for a in range(0, n - 1, CHUNK):
        b = min(n - 1, a + CHUNK)
        logits = model(x[:, a:b], cache=caches)[0].astype(mx.float32)
        nll += nn.losses.cross_entropy(logits, x[0, a + 1:b + 1], reduction="sum").item()
    return math.exp(nll / (n - 1)), sum(c.nbytes for c in caches)


@pytest.fixture(scope="module")
def default_model():
    return load_model(MODEL)


def test_a_long_conversation_with_8_bit_keys_and_values(default_model, seed=1):
    model, layers = default_model.model, len(default_model.make_cache())
    ids = conversation(default_model.tokenizer, 2048, seed)
    beside = conversation(default_model.tokenizer, random.Random(seed).randint(600, 1500), seed + 100)
    float_ppl, float_bytes = read(model, [ids], [BatchKVCache([0]) for _ in range(layers)])
    padding = len(ids) - len(beside)
    q8_ppl, q8_bytes = read(model, [ids, beside], [BatchQuantizedKV([0, padding], 64, 8) for _ in range(layers)])
    assert abs(q8_ppl / float_ppl - 1) < 0.01, (q8_ppl, float_ppl)
    assert q8_bytes / 2 <= 0.55 * float_bytes, (q8_bytes, float_bytes)  # two rows of the same length


def test_the_default_model_serves_8_bit_rows_batched_as_alone(default_model):
    rng = random.Random(7)
    words = TEXT.read_text().split()
    texts = [" ".join(words[s:s + rng.randint(5, 200)]) for s in (rng.randrange(len(words) - 200) for _ in range(6))]
    prompts = [encode_prompt(default_model.tokenizer, t, chat=True) for t in texts]
    want = [reply_tokens(default_model, p, 12, quantized_cache(default_model, 8, 64)) for p in prompts]
    with Engine(MODEL, kv_bits=8, wait=True) as engine:
        handles = [engine.submit(prompt=t, max_tokens=12) for t in texts]
        got = [h.result(timeout=300).token_ids for h in handles]
        assert engine.status()["peak_batch_size"] > 1 and engine.status()["kv_cache"]["bits"] == 8
    assert got == want
