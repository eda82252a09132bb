"""Architectures that need care: refused at load with a clear message, or batched a safe way.

Both are real mlx_lm architectures built small with random weights in a temporary directory.
"""

import pytest

from mlx_nb import Engine
from mlx_nb.models import ModelLoadError
from mlx_nb.models.fixtures import write_random_model
from mlx_nb.models.templates import LENIENT_CHATML
from mlx_nb.models.tiny_tokenizer import VOCAB_SIZE

# llama4 reads its context in chunks: ChunkedKVCache has no merge, so rows of it cannot be batched.
LLAMA4 = {
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text", "vocab_size": VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 64, "intermediate_size_mlp": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "attention_bias": False, "attention_chunk_size": 8, "interleave_moe_layer_step": 1,
        "num_local_experts": 2, "num_experts_per_tok": 1, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_scaling": None, "rope_theta": 10000.0, "use_qk_norm": True,
    },
}

# nemotron_h's SSM ignores right-padding lengths: a padded batched prefill corrupts shorter rows.
NEMOTRON_H = {
    "model_type": "nemotron_h", "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128,
    "max_position_embeddings": 4096, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "attention_bias": False, "mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_proj_bias": False,
    "ssm_state_size": 16, "conv_kernel": 4, "n_groups": 1, "mlp_bias": False, "layer_norm_epsilon": 1e-5,
    "use_bias": False, "use_conv_bias": True, "hybrid_override_pattern": "M*M-", "tie_word_embeddings": True,
}


def build(tmp_path, name: str, config: dict) -> str:
    out = tmp_path / name
    out.mkdir()
    write_random_model(out, config, LENIENT_CHATML, seed=7)
    return str(out)


def test_a_model_whose_cache_cannot_merge_is_refused_at_load(tmp_path):
    engine = Engine(build(tmp_path, "tiny-llama4", LLAMA4))
    with pytest.raises(ModelLoadError) as err:
        engine.wait_ready(120)
    message = str(err.value)
    assert "ChunkedKVCache" in message and "cannot be batched" in message and "\n" not in message
    engine.close()


PROMPTS = ["a", "a much longer prompt than the others, " * 3, "one of middle length"]


def test_padding_unsafe_ssm_is_prefilled_one_request_at_a_time_and_matches_alone(tmp_path):
    with Engine(build(tmp_path, "tiny-nemotron-h", NEMOTRON_H), prefix_cache=False, wait=True) as engine:
        alone = [engine.generate(prompt=p, max_tokens=8).token_ids for p in PROMPTS]
        together = [engine.submit(prompt=p, max_tokens=8) for p in PROMPTS]
        assert [h.result(timeout=120).token_ids for h in together] == alone
        assert engine.status()["prefill_batch"] == 1


def test_which_cache_types_can_join_a_batch():
    """The load-time check behind the refusal above, for every mlx_lm cache type (seed 003: a
    quantized KV cache must be refused clearly, never crash mid-batch)."""
    from mlx_lm.models.cache import (
        ArraysCache, CacheList, ChunkedKVCache, KVCache, QuantizedKVCache, RotatingKVCache,
    )

    from mlx_nb.engine.layout import is_batchable

    assert is_batchable(KVCache()) and is_batchable(ArraysCache(2)) and is_batchable(RotatingKVCache(8))
    assert is_batchable(CacheList(ArraysCache(2), KVCache()))
    assert not is_batchable(QuantizedKVCache())
    assert not is_batchable(ChunkedKVCache(8))
    assert not is_batchable(RotatingKVCache(8, keep=4))  # batched rotating caches keep nothing
    assert not is_batchable(CacheList(ArraysCache(2), QuantizedKVCache()))
