"""What each GGUF architecture is in mlx_lm's terms: its model_type, config and tensor names.

llama.cpp's converter (convert_hf_to_gguf.py) renames Hugging Face tensors and, for a few families,
changes them; each `Arch` here undoes exactly that:
- llama (and Mistral, whose files say llama): q/k rows permuted for interleaved RoPE, so the config
  says `rope_traditional` instead of undoing the permutation; Llama 3 RoPE scaling as a table.
- qwen2 (q/k/v biases), qwen3 (q/k norms), qwen3moe (experts stacked per layer, a router): Hugging
  Face's row order, NEOX RoPE.
- gemma2, gemma3: every norm weight is stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w);
  llama.cpp's attention scale and Gemma 3's sliding-window pattern of 6 are the converter's constants.
- phi3: q/k/v fused and gate/up fused, as Hugging Face ships them; LongRoPE factors as two tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_nb.models.gguf_meta import GGUFError
from mlx_nb.models.gguf_meta import meta as _meta

TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# Block tensors of the llama family; other architectures add or rename a few.
LLAMA_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
MOE_BLOCK = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}
GEMMA_BLOCK = {
    **{k: v for k, v in LLAMA_BLOCK.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
PHI3_BLOCK = {
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


class Meta:
    """Reads `<arch>.<key>` metadata of one file, with one-line errors naming the file."""

    def __init__(self, src: Path, meta: dict, arch: str):
        self.src, self.meta, self.arch = src, meta, arch

    def __call__(self, key: str, default: Any = ...) -> Any:
        return _meta(self.src, self.meta, f"{self.arch}.{key}", default)

    def shape(self) -> dict:
        """The config entries every architecture has."""
        heads = int(self("attention.head_count"))
        kv = self("attention.head_count_kv", heads)
        if isinstance(kv, list):  # per-layer counts (some converters write one per layer)
            if len(set(kv)) != 1:
                raise GGUFError(f"{self.src} has a different number of KV heads per layer, which mlx_lm's "
                                f"{self.arch} does not support: pass another file")
            kv = kv[0]
        return {
            "hidden_size": int(self("embedding_length")),
            "num_hidden_layers": int(self("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(kv),
            "rms_norm_eps": float(self("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self("context_length", 4096)),
        }


@dataclass
class Arch:
    """One GGUF architecture: the mlx_lm model it becomes and how its tensors are named."""

    model_type: str
    block: dict
    config: Callable[[Meta, dict], dict]  # (metadata, tensors by GGUF name) -> model-specific config
    norm_offset: float = 0.0  # stored norm weights minus this are mlx_lm's
    optional: tuple = ()  # block tensors a file may leave out (biases, fused or split variants)
    extra_top: dict = field(default_factory=dict)


def _ffn(m: Meta) -> dict:
    return {"intermediate_size": int(m("feed_forward_length"))}


def _head_dim(m: Meta, shape: dict) -> int:
    return int(m("attention.key_length", shape["hidden_size"] // shape["num_attention_heads"]))


def _llama(m: Meta, tensors: dict) -> dict:
    shape = m.shape()
    head_dim = _head_dim(m, shape)
    rope_dim = int(m("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise GGUFError(f"{m.src} uses partial RoPE ({rope_dim} of {head_dim} dims), which mlx_lm's llama does "
                        "not support: pass another file")
    if m("expert_count", 0):
        raise GGUFError(f"{m.src} is a mixture-of-experts llama (Mixtral-style), which is not supported: "
                        "pass a dense llama GGUF")
    return {**_ffn(m), "head_dim": head_dim, "rope_traditional": True,
            "attention_bias": "blk.0.attn_q.bias" in tensors, "mlp_bias": "blk.0.ffn_up.bias" in tensors}


def _qwen2(m: Meta, tensors: dict) -> dict:
    return {**_ffn(m), "rope_traditional": False}


def _qwen3(m: Meta, tensors: dict) -> dict:
    return {**_ffn(m), "head_dim": _head_dim(m, m.shape())}


def _qwen3moe(m: Meta, tensors: dict) -> dict:
    experts = int(m("expert_count"))
    moe = int(m("expert_feed_forward_length"))
    return {"head_dim": _head_dim(m, m.shape()), "num_experts": experts,
            "num_experts_per_tok": int(m("expert_used_count")), "moe_intermediate_size": moe,
            "intermediate_size": int(m("feed_forward_length", moe)), "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True}


def _gemma_scale(m: Meta, shape: dict, head_dim: int) -> int:
    """llama.cpp's query scale for Gemma 2 / 3: hidden / heads for the 27B models (46 and 62
    layers), else the head dimension."""
    big = shape["num_hidden_layers"] in (46, 62)
    return int(shape["hidden_size"] // shape["num_attention_heads"] if big else head_dim)


def _gemma2(m: Meta, tensors: dict) -> dict:
    shape = m.shape()
    head_dim = _head_dim(m, shape)
    return {**_ffn(m), "head_dim": head_dim, "query_pre_attn_scalar": _gemma_scale(m, shape, head_dim),
            "attn_logit_softcapping": float(m("attn_logit_softcapping", 50.0)),
            "final_logit_softcapping": float(m("final_logit_softcapping", 30.0))}


def _gemma3(m: Meta, tensors: dict) -> dict:
    shape = m.shape()
    head_dim = _head_dim(m, shape)
    config = {**_ffn(m), "head_dim": head_dim, "query_pre_attn_scalar": _gemma_scale(m, shape, head_dim),
              "sliding_window": int(m("attention.sliding_window", 512)), "sliding_window_pattern": 6,
              "rope_local_base_freq": 10000.0}
    if m("rope.scaling.type", "none") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(m("rope.scaling.factor", 1.0))}
    return config


def _phi3(m: Meta, tensors: dict) -> dict:
    shape = m.shape()
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    config = {**_ffn(m), "partial_rotary_factor": int(m("rope.dimension_count", head_dim)) / head_dim}
    if "rope_factors_long.weight" in tensors:
        long, short = (tensors[f"rope_factors_{k}.weight"].floats().tolist() for k in ("long", "short"))
        config["rope_scaling"] = {"type": "longrope", "long_factor": long, "short_factor": short}
        config["original_max_position_embeddings"] = int(m("rope.scaling.original_context_length", 4096))
    return config


ARCHS = {
    "llama": Arch("llama", LLAMA_BLOCK, _llama, optional=("attn_q.bias", "attn_k.bias", "attn_v.bias",
                                                             "attn_output.bias", "ffn_up.bias", "ffn_gate.bias",
                                                             "ffn_down.bias")),
    "qwen2": Arch("qwen2", LLAMA_BLOCK, _qwen2),
    "qwen3": Arch("qwen3", {**LLAMA_BLOCK, **QK_NORMS}, _qwen3),
    "qwen3moe": Arch("qwen3_moe", {**{k: v for k, v in LLAMA_BLOCK.items() if not k.startswith("ffn_")},
                                   "ffn_norm": "post_attention_layernorm", **QK_NORMS, **MOE_BLOCK}, _qwen3moe),
    "gemma2": Arch("gemma2", GEMMA_BLOCK, _gemma2, norm_offset=1.0),
    "gemma3": Arch("gemma3_text", {**GEMMA_BLOCK, **QK_NORMS}, _gemma3, norm_offset=1.0),
    "phi3": Arch("phi3", PHI3_BLOCK, _phi3),
}

# Tensors of a file that carry configuration rather than weights (read by the config functions).
CONFIG_TENSORS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}

# Block tensors whose bias is part of the architecture (mlx_lm builds these projections with one).
REQUIRED_BIASES = {"qwen2": ("attn_q", "attn_k", "attn_v")}


def arch_of(src: Path, meta: dict) -> tuple[str, Arch]:
    name = _meta(src, meta, "general.architecture", None)
    if name not in ARCHS:
        raise GGUFError(
            f"{src} is a {name!r} model, and GGUF files of these architectures can be converted: "
            f"{', '.join(sorted(ARCHS))}: pass one of those or load the model's MLX/Hugging Face directory instead"
        )
    return name, ARCHS[name]


def block_target(arch: Arch, base: str) -> Optional[str]:
    return arch.block.get(base)
