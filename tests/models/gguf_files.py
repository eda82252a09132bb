"""GGUF files of every supported architecture, written as llama.cpp writes them, beside the same
weights as an mlx_lm model: the reference a converted file must compute like.

- Names come from gguf-py's own `TensorNameMap` (llama.cpp's mapping from Hugging Face names), not
  from the converter under test.
- The changes llama.cpp's converter makes are made here from its rules: llama's q/k rows permuted for
  interleaved RoPE, Gemma's norms stored as 1 + w.
- Quantized tensors are random *valid blocks* of each type (random bytes, scales set to sane
  float16 values), so every bit pattern of the quants is exercised; the reference model gets
  exactly those weights as float32, dequantized by gguf-py.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from mlx.utils import tree_flatten

from ggml_blocks import QUANT_TYPES, dequantize, random_blocks

# What each GGUF architecture is called in mlx_lm.
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "gemma2": "gemma2",
               "gemma3": "gemma3_text", "phi3": "phi3"}


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of q / k rows (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_config(arch: str, rng) -> dict:
    """A random small config of `arch` in mlx_lm's terms; matrices' inputs are multiples of 256 so
    every block type fits (K-quants hold 256 weights a block)."""
    hidden = int(rng.choice([256, 512]))
    heads = int(rng.choice([4, 8]))
    kv = int(rng.choice([h for h in (1, 2, 4) if heads % h == 0]))
    head_dim = 256 // heads * int(rng.choice([1, 2]))  # heads * head_dim: 256 or 512
    layers = int(rng.integers(2, 4))
    ffn = int(rng.choice([256, 512, 768]))
    base = {"model_type": MODEL_TYPES[arch], "hidden_size": hidden, "num_hidden_layers": layers,
            "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": kv,
            "rms_norm_eps": float(rng.choice([1e-5, 1e-6])), "rope_theta": float(rng.choice([10000.0, 500000.0])),
            "max_position_embeddings": 4096, "vocab_size": 0, "tie_word_embeddings": bool(rng.integers(0, 2))}
    if arch == "llama":
        base.update(head_dim=head_dim, rope_traditional=False)
    elif arch == "qwen2":
        base.update(hidden_size=heads * head_dim)  # qwen2's head_dim is hidden / heads
    elif arch == "qwen3":
        base.update(head_dim=head_dim)
    elif arch == "qwen3moe":
        base.update(head_dim=head_dim, num_experts=int(rng.choice([4, 8])), num_experts_per_tok=2,
                    moe_intermediate_size=256, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    elif arch == "gemma2":
        base.update(head_dim=head_dim, query_pre_attn_scalar=float(head_dim), attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, tie_word_embeddings=True)
    elif arch == "gemma3":
        base.update(head_dim=head_dim, query_pre_attn_scalar=float(head_dim), sliding_window=8,
                    sliding_window_pattern=6, num_hidden_layers=6, rope_local_base_freq=10000.0,
                    rope_theta=1000000.0, tie_word_embeddings=True)
    elif arch == "phi3":
        base.update(hidden_size=heads * head_dim, partial_rotary_factor=float(rng.choice([1.0, 0.75])))
    return base


def _reference_model(config: dict):
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    if config.get("tie_word_embeddings") and "lm_head" in model:
        model.pop("lm_head")
        if hasattr(model, "tie_word_embeddings"):  # gemma3_text reads it at every call
            model.tie_word_embeddings = True
    return model


def _gguf_name(names, arch: str, path: str) -> str:
    path = path.replace("mlp.switch_mlp.", "mlp.experts.")
    base, _, suffix = path.rpartition(".")
    name = names.get_name(base)
    assert name is not None, f"gguf-py has no name for {path} in {arch}"
    return f"{name}.{suffix}"


def write_pair(arch: str, config: dict, vocab, path: Path, rng, types=QUANT_TYPES):
    """Write `path` (a GGUF of `arch`) and return the mlx_lm model holding the same weights (float32).
    `vocab` is (tokens, token types, tokenizer metadata) as test_gguf's vocabularies give them."""
    tokens, token_types, tok_meta = vocab
    config = {**config, "vocab_size": len(tokens)}
    model = _reference_model(config)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    gemma = arch.startswith("gemma")
    writer = gguf.GGUFWriter(str(path), arch)
    reference = {}
    for name, p in tree_flatten(model.parameters()):
        shape = tuple(p.shape)
        target = _gguf_name(names, arch, name)
        if len(shape) == 1:  # norms and biases stay float
            if name.endswith("norm.weight"):
                w = (rng.normal(0, 0.1, shape) + (0.0 if gemma else 1.0)).astype(np.float32)
                writer.add_tensor(target, w + np.float32(1.0) if gemma else w)
            else:
                w = rng.normal(0, 0.05, shape).astype(np.float32)
                writer.add_tensor(target, w)
            reference[name] = w
            continue
        kind = str(rng.choice(types))
        raw = random_blocks(kind, shape, rng)
        w = dequantize(kind, raw, shape)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):  # the file holds them permuted
            w = llama_unpermute(w, heads if "q_proj" in name else kv)
        writer.add_tensor(target, raw, raw_dtype=T[kind])
        reference[name] = w
    model.load_weights([(k, mx.array(v)) for k, v in reference.items()], strict=True)
    mx.eval(model.parameters())
    _metadata(writer, arch, config, tokens, token_types, tok_meta)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _metadata(writer, arch: str, config: dict, tokens, token_types, tok_meta) -> None:
    w = writer
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    w.add_name(f"tiny-{arch}")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
    w.add_vocab_size(config["vocab_size"])
    if arch == "qwen3moe":
        w.add_expert_count(config["num_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(config.get("sliding_window", 4096))
    w.add_tokenizer_model(tok_meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(tok_meta.get("tokenizer.ggml.pre", "default"))
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    if "tokenizer.ggml.merges" in tok_meta:
        w.add_token_merges(tok_meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(int(tok_meta["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(tok_meta["tokenizer.ggml.eos_token_id"]))
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>{% endif %}")


def byte_level_vocab():
    """A tiny byte-level BPE vocabulary (as a gpt2-style GGUF tokenizer holds it)."""
    from tokenizers.pre_tokenizers import ByteLevel

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll", "Ġ w"]
    tokens = specials + alphabet + ["he", "ll", "hell", "Ġw"]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2", "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    return tokens, types, meta
