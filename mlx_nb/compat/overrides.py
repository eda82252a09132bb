"""Per-architecture config values that generation from ModelArgs cannot infer, each with its reason.

Most are a layer-type vocabulary of the module's own (which strings mean "attention" and which
"recurrent"), a nested dict the module indexes by key, or a per-layer list. Values keep the sizes
of `configs.py` (hidden 64, 4 layers, 4 heads of 16, windows of 8).
"""

from __future__ import annotations

L = 4  # layers, as in configs.LAYERS
ALT = ["sliding_attention", "full_attention"] * (L // 2)
ROPE_BY_TYPE = {t: {"rope_theta": 10000.0, "rope_type": "default"} for t in ("sliding_attention", "full_attention")}
YARN = {"type": "yarn", "rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}

OVERRIDES: dict[str, dict] = {
    # attention reads its key/value heads, clipping and rope base from a nested dict
    "dbrx": {"attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
             "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}},
    # head_dim = hidden / heads and a two-tap key/value convolution (asserted)
    "baichuan_m1": {"conv_window": 2, "sliding_window_layers": [0, 2]},
    # yarn / longrope scaling read unconditionally
    "deepseek_v2": {"rope_scaling": YARN},
    "minicpm3": {"rope_scaling": {"original_max_position_embeddings": 4096, "short_factor": [1.0] * 4,
                                  "long_factor": [1.0] * 4}},
    "hunyuan": {"rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}},
    # the pattern is a string of L(ocal)/G(lobal), not a period
    "exaone4": {"sliding_window_pattern": "LG", "layer_types": ALT},
    # per-layer lists: which layers are MoE, which use rope, heads per layer
    "exaone_moe": {"is_moe_layer": [False, True, True, True]},
    "llama4_text": {"no_rope_layers": [1, 1, 1, 0]},
    "openelm": {"num_query_heads": [4] * L, "num_kv_heads": [2] * L, "ffn_multipliers": [2.0] * L,
                "head_dim": 16, "num_transformer_layers": L},
    # rope parameters given per layer type
    "mellum": {"rope_parameters": ROPE_BY_TYPE},
    "spark2_5": {"rope_parameters": ROPE_BY_TYPE},
    # GPT-J / phixtral rotate a fixed number of dims: at most the head size
    "gptj": {"rotary_dim": 8},
    "phixtral": {"rotary_dim": 8},
    # keys and values shared by groups of query heads: 2 of 4
    "plamo": {"n_shared_head": 2},
    # the module's own layer-type names
    "granitemoehybrid": {"layer_types": ["mamba", "attention"] * (L // 2), "mamba_n_heads": 8,
                         "mamba_d_head": 16},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "nemotron_h": {"layer_types": ["mamba", "attention", "mamba", "moe"],
                   "layers_block_type": ["mamba", "attention", "mamba", "moe"], "routed_scaling_factor": 1.0},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "kimi_linear": {"linear_attn_config": {"kda_layers": [1, 3], "num_heads": 4, "head_dim": 16,
                                           "short_conv_kernel_size": 4}},
    "mimo_v2_flash": {"hybrid_layer_pattern": [1, 0, 1, 0], "moe_layer_freq": [0, 1, 1, 1], "topk_method": "noaux_tc"},
    # the MLA scales are attributes only when enabled
    "longcat_flash_ngram": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True, "zero_expert_type": "identity",
                            "zero_expert_num": 1},
    # the routed experts plus "zero" (identity) experts
    "longcat_flash": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True, "zero_expert_type": "identity",
                      "zero_expert_num": 1},
    # transformers validates this pair too: hidden * expand == heads * head_dim
    "mamba2": {"num_heads": 8},
    # the module's own layer-type names (transformers checks them when the tokenizer loads)
    "olmo_hybrid": {"layer_types": ["linear_attention", "full_attention"] * (L // 2)},
    # DeepSeek-style routers only accept grouped, auxiliary-loss-free top-k
    "glm_moe_dsa": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "topk_method": "noaux_tc"},
    # block-sparse attention in blocks smaller than the prompts
    "phi3small": {"blocksparse_block_size": 32, "blocksparse_num_local_blocks": 1, "blocksparse_vert_stride": 2},
    # transformers checks that the (absent) audio encoder's width matches the text model's
    "muse_spark": {"audio_config": {"out_hidden_size": 64}},
    # per-layer blocks: grouped attention, no attention, a linear layer instead, no feed-forward
    "nemotron-nas": {"block_configs": [
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
        {"attention": {"no_op": True}, "ffn": {"ffn_mult": 2.0}},
        {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"n_heads_in_group": 2}, "ffn": {"no_op": True}},
    ]},
    # a separate output layer (scaled by dim_model_base): tied weights leave it unused
    "minicpm": {"tie_word_embeddings": False},
}

TEXT_OVERRIDES: dict[str, dict] = {
    "gemma3n": {"layer_types": ALT, "activation_sparsity_pattern": [0.0] * L, "num_kv_shared_layers": 2,
                "intermediate_size": [128] * L, "altup_num_inputs": 2, "altup_active_idx": 0,
                "altup_coef_clip": 120.0, "laurel_rank": 8},
    "kimi_k3": {"linear_attn_config": {"kda_layers": [1, 3], "num_heads": 4, "head_dim": 16,
                                       "short_conv_kernel_size": 4}},
    # only one routed expert per token
    "llama4": {"num_experts_per_tok": 1, "no_rope_layers": [1, 1, 1, 0], "interleave_moe_layer_step": 2},
    "minimax_m3_vl": {"moe_layer_freq": [0, 1, 1, 1], "layer_types": ["minimax_m3_sparse", "full_attention"] * 2,
                      "sparse_attention_config": {"sparse_num_index_heads": 2, "sparse_index_dim": 16,
                                                  "sparse_block_size": 4, "sparse_topk_blocks": 2,
                                                  "sparse_local_block": 1},
                      "dense_intermediate_size": 128},
    "mistral3": {"model_type": "ministral3"},
    # every feed-forward layer must be sparse
    "muse_spark": {"num_shared_experts": 0, "layer_rope_theta": [10000.0, 0.0, 10000.0, 10000.0]},
}

# Scaled rope (llama 4 style) read unconditionally
_LLAMA4_ROPE = {"rope_theta": 10000.0, "rope_type": "default", "llama_4_scaling_beta": 0.1,
                "original_max_position_embeddings": 4096}
OVERRIDES["ministral3"] = {"rope_parameters": _LLAMA4_ROPE}
OVERRIDES["mistral4"] = {"rope_parameters": {**_LLAMA4_ROPE, **YARN}}
TEXT_OVERRIDES["mistral3"]["rope_parameters"] = _LLAMA4_ROPE

# Modules that are a weight format rather than an architecture: no random tiny instance is honest.
NOT_TINY: dict[str, str] = {
    "prism_hadamard_qwen35": "a pre-quantized 2-bit Hadamard-rotated weight pack of qwen3_5 (it needs the "
                             "pack's module manifest); qwen3_5 itself is measured",
}
