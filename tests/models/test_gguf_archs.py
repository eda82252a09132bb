"""Every GGUF architecture we convert computes what mlx_lm computes with the same weights.

For each architecture, random instances (sizes, head layouts, tied or not, a block type drawn per
tensor from all eight) are written as llama.cpp writes them and, beside, as an mlx_lm model holding
the same weights in float32 (tests/models/gguf_files.py). The converted file must give the same
logits (within the kernels' two-digit activation quantization), keep every tensor in its own block
type, and the engine must serve it: four chats in one batch (one at a time where the compatibility
matrix says so), each greedy token one the reference model would pick (its logit within the
kernels' tolerance of the reference's best).
"""

import mlx.core as mx
import numpy as np
import pytest

from gguf_files import byte_level_vocab, tiny_config, write_pair
from ggml_blocks import QUANT_TYPES
from mlx_nb.kernels.layers import QLinear, Stacked
from mlx_nb.magics.tables import status_table
from mlx_nb.models import load_model
from mlx_nb.models.gguf import convert_gguf

ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3"]
SEEDS = [0, 1, 2]


def _pair(arch, seed, tmp_path):
    rng = np.random.default_rng(1000 * ARCHS.index(arch) + seed)
    config = tiny_config(arch, rng)
    reference = write_pair(arch, config, byte_level_vocab(), tmp_path / f"{arch}.gguf", rng)
    converted = convert_gguf(tmp_path / f"{arch}.gguf", tmp_path / arch, progress=False)
    return rng, config, reference, converted


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_converted_file_computes_what_mlx_lm_computes(arch, seed, tmp_path):
    rng, config, reference, converted = _pair(arch, seed, tmp_path)
    loaded = load_model(str(converted))
    assert set(loaded.formats) <= set(QUANT_TYPES), loaded.formats  # every tensor in its own block type
    assert sum(loaded.formats.values()) == len(loaded.config["gguf"]["tensors"])
    for _, m in loaded.model.named_modules():  # projections of mixed types: one matmul per run of one type
        if isinstance(m, Stacked):
            assert all(QLinear.concat([a, b]) is None for a, b in zip(m.parts, m.parts[1:]))
    ids = mx.array([rng.integers(3, loaded.config["vocab_size"], 24).tolist()])
    want, got = reference(ids), loaded.model(ids)
    assert got.shape == want.shape
    assert _relative(want, got) < 2e-3, f"{arch} seed {seed}: logits differ by {_relative(want, got):.1e}"


def table_rows(status):
    return status_table(status, "embedded").rows


def _within_tolerance(reference, prompt: list[int], reply: list[int], tol: float = 2e-3) -> list[int]:
    """Positions where `reply` picked a token the reference model would not (teacher-forced: its
    logit more than `tol` of the logit range below the reference's best)."""
    logits = np.asarray(reference(mx.array([prompt + reply]))[0, len(prompt) - 1:-1], np.float64)
    picked = logits[np.arange(len(reply)), reply]
    span = logits.max(-1) - logits.min(-1)
    return [i for i in range(len(reply)) if picked[i] < logits[i].max() - tol * span[i]]


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_serves_each_architecture_in_one_batch(arch, tmp_path):
    from held import held

    from mlx_nb import Engine

    rng, config, reference, converted = _pair(arch, 0, tmp_path)
    prompts = [rng.integers(3, 260, int(n)).tolist() for n in rng.integers(3, 20, 4)]
    with Engine(str(converted), wait=True) as engine:
        eos = {t: -100 for t in engine.loaded.tokenizer.eos_token_ids}  # full-length replies
        with held(engine):
            handles = [engine.submit(prompt=engine.loaded.tokenizer.decode(p), max_tokens=16, logit_bias=eos)
                       for p in prompts]
        results = [h.result(timeout=300) for h in handles]
        # one batch, or one at a time where docs/compatibility.md says the architecture must (gemma2)
        assert engine.status()["peak_batch_size"] == (1 if engine.policy.mode == "sequential" else 4)
        prompt_ids = [engine.loaded.tokenizer.encode(engine.loaded.tokenizer.decode(p)) for p in prompts]
        status = engine.status()
        kinds = set(engine.loaded.config["gguf"]["tensors"].values())
    # %mlx status names each block type the file holds, with its count
    assert set(status["weights"]["formats"]) == kinds
    line = dict(table_rows(status))["weights"]
    assert all(f"{k} x" in line for k in kinds), line
    for p, r in zip(prompt_ids, results):
        assert r.finish_reason == "length" and len(r.token_ids) == 16
        off = _within_tolerance(reference, p, r.token_ids)
        assert not off, f"{arch}: tokens at {off} are not the reference's choice"
