"""Tiny configs for every architecture module of the installed mlx_lm, generated from ModelArgs.

Each config is derived from the module's `ModelArgs` dataclass: a field whose name says what it
sizes gets a tiny value (hidden 64, 4 layers, 4 heads, 4 experts, 288-token vocabulary = the tiny
tokenizer's), any other field without a default gets a value from its type, and the fields that
choose a layer-type pattern (hybrid patterns, attention intervals, sliding windows) are set so
both kinds of layer appear and every sliding window is smaller than the sweep's prompts. Only
what generation cannot infer is written per architecture, in `overrides.py`, with its reason.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import typing
from pathlib import Path
from typing import Any, Optional

from mlx_nb.compat.overrides import NOT_TINY, OVERRIDES, TEXT_OVERRIDES
from mlx_nb.models.tiny_tokenizer import VOCAB_SIZE

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 4, 2, 16, 4
WINDOW = 8  # a sliding window smaller than all but the shortest prompts

# Field name -> tiny value, whatever the module's default (defaults are the full-size model's).
SIZES: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE, "num_vocab": VOCAB_SIZE,
    "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "model_dim": HIDDEN, "hidden_dim": HIDDEN,
    "dim": HIDDEN, "block_dim": HIDDEN,
    "intermediate_size": 128, "ffn_hidden_size": 128, "ff_intermediate_size": 128, "n_inner": 128,
    "intermediate_size_mlp": 128, "mlp_hidden_size": 128, "block_ff_dim": 128,
    "moe_intermediate_size": 32, "expert_ffn_hidden_size": 32, "shared_expert_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32, "shared_intermediate_size": 32, "share_expert_dim": 32,
    "num_hidden_layers": LAYERS, "num_layers": LAYERS, "n_layer": LAYERS, "n_layers": LAYERS,
    "num_attention_heads": HEADS, "n_head": HEADS, "n_heads": HEADS, "num_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "num_kv_heads": KV_HEADS, "n_kv_heads": KV_HEADS,
    "num_swa_attention_heads": HEADS, "num_swa_key_value_heads": KV_HEADS, "swa_num_attention_heads": HEADS,
    "swa_num_key_value_heads": KV_HEADS, "num_global_key_value_heads": KV_HEADS, "num_attention_groups": KV_HEADS,
    "head_dim": HEAD_DIM, "swa_head_dim": HEAD_DIM, "swa_v_head_dim": HEAD_DIM, "global_head_dim": HEAD_DIM,
    "kv_channels": HEAD_DIM, "hidden_size_per_head": HEAD_DIM, "qk_head_dim": HEAD_DIM,
    "max_position_embeddings": 4096, "n_positions": 4096, "n_ctx": 4096, "model_max_length": 4096,
    "original_max_position_embeddings": 4096,
    # mixture of experts: few experts, top-2, one shared; both dense and sparse layers
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_topk": 2, "moe_top_k": 2, "moe_k": 2,
    "top_k_experts": 2, "n_shared_experts": 1, "num_shared_experts": 1, "num_shared_expert": 1,
    "moe_num_shared_experts": 1, "n_group": 1, "topk_group": 1, "num_expert_group": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "decoder_sparse_step": 1, "num_dense_layers": 1,
    "moe_layer_start_index": 1, "moe_layer_interval": 1, "mlp_only_layers": [0],
    # multi-head latent attention
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "o_lora_rank": 16, "o_groups": 2,
    # sparse-attention indexers: few heads, a top-k smaller than the prompts
    "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8,
    # state-space / recurrent layers
    "mamba_d_state": 16, "ssm_state_size": 16, "state_size": 16, "mamba_d_conv": 4, "conv_kernel": 4,
    "mamba_d_head": 16, "mamba_head_dim": 16, "mamba_n_heads": 8, "mamba_num_heads": 8, "mamba_n_groups": 1,
    "n_groups": 1, "mamba_expand": 2, "mamba_chunk_size": 16, "mamba_d_ssm": 128, "time_step_rank": 8,
    "conv_L_cache": 3, "conv1d_width": 4, "linear_conv_kernel_dim": 4, "short_conv_kernel_size": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "a_low_rank_dim": 8, "v_low_rank_dim": 8, "gate_low_rank_dim": 8,
    "decay_low_rank_dim": 8, "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB_SIZE,
    "num_kv_shared_layers": 2,
    # layer-type patterns: both kinds among 4 layers, windows smaller than the prompts
    "sliding_window": WINDOW, "sliding_window_size": WINDOW, "attention_window_size": WINDOW,
    "window_size": WINDOW, "conv_window": 4, "loop_window_size": WINDOW, "attention_chunk_size": WINDOW,
    "layer_types": ["sliding_attention", "full_attention"] * (LAYERS // 2),
    "sliding_window_pattern": 2, "full_attention_interval": 2, "layer_group_size": 2,
    "dense_attention_every_n_layers": 2, "no_rope_layer_interval": 2, "mamba_step": 2,
    "rms_norm_eps": 1e-5, "layer_norm_eps": 1e-5, "layer_norm_epsilon": 1e-5, "norm_eps": 1e-5,
    "layernorm_epsilon": 1e-5, "norm_epsilon": 1e-5,
    "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "time_step_limit": [0.001, 100.0],
}

# Field name -> value, only where the module gives no default (a default is a valid choice).
REQUIRED: dict[str, Any] = {
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "score_func": "sigmoid", "hidden_act": "silu",
    "routed_scaling_factor": 1.0, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


# The instances each architecture is measured on: a verdict is one that every instance agrees on
# (a state that reads the padding can still give the same greedy tokens on one weight draw).
# name -> (seed, variant); a variant names SIZES fields to change where the config has them, and
# "flip_tie" flips the module's default for tied input/output embeddings.
INSTANCES: dict[str, tuple[int, dict]] = {
    "seed 7": (7, {}),
    "seed 11": (11, {}),
    "seed 23, ties flipped, wider low-rank": (23, {
        "flip_tie": True, "kv_lora_rank": 32, "q_lora_rank": 32, "a_low_rank_dim": 16, "v_low_rank_dim": 16,
        "gate_low_rank_dim": 16, "decay_low_rank_dim": 16, "time_step_rank": 16, "sliding_window": 5,
        "sliding_window_size": 5, "attention_window_size": 5, "window_size": 5, "attention_chunk_size": 5}),
    "seed 31, wide heads, other layer order": (31, {
        "head_dim": 32, "swa_head_dim": 32, "kv_channels": 32, "hidden_size_per_head": 32, "qk_head_dim": 32,
        "num_key_value_heads": 1, "num_kv_heads": 1, "n_kv_heads": 1, "conv_kernel": 3, "mamba_d_conv": 3,
        "linear_conv_kernel_dim": 3, "short_conv_kernel_size": 3, "conv1d_width": 3, "mamba_d_state": 8,
        "ssm_state_size": 8, "state_size": 8,
        "layer_types": ["full_attention", "sliding_attention"] * (LAYERS // 2)}),
}


class NotTinyError(ValueError):
    """A module no random tiny instance can stand for (the message says why)."""


def architectures() -> list[str]:
    """Every module of the installed mlx_lm that defines (or re-exports) `Model` and `ModelArgs`.

    Read from the source with `ast`, not imported: some modules exit the interpreter on import
    when an optional package is missing.
    """
    import mlx_lm.models

    out = []
    for path in sorted(Path(mlx_lm.models.__file__).parent.glob("*.py")):
        names = _top_level_names(ast.parse(path.read_text()))
        if {"Model", "ModelArgs"} <= names:
            out.append(path.stem)
    return out


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def write_tiny(arch: str, out: Path, seed: int = 7, variant: Optional[dict] = None) -> Path:
    """A tiny random `arch` model directory at `out` (seeded weights, the tiny tokenizer)."""
    from mlx_nb.models.fixtures import write_random_model
    from mlx_nb.models.templates import LENIENT_CHATML

    out.mkdir(parents=True, exist_ok=True)
    write_random_model(out, tiny_config(arch, variant), LENIENT_CHATML, seed)
    return out


def tiny_config(arch: str, variant: Optional[dict] = None) -> dict:
    """A config.json dict for a tiny instance of `mlx_lm.models.<arch>`, changed by `variant` (see
    INSTANCES) where it has the fields; the per-architecture overrides still win."""
    if arch in NOT_TINY:
        raise NotTinyError(NOT_TINY[arch])
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    sizes = {**SIZES, **{k: v for k, v in (variant or {}).items() if k != "flip_tie"}}
    flip_tie = bool((variant or {}).get("flip_tie"))
    config = {"model_type": arch, **_fill(module.ModelArgs, arch, sizes, flip_tie)}
    text_args = _text_args(module)
    if text_args is not None:  # a wrapper (often a vision model's language half): its text model's args
        inner = text_args.__module__.rsplit(".", 1)[-1]
        config["text_config"] = _fill(text_args, inner if inner != arch else f"{arch}_text", sizes, flip_tie)
        config["text_config"].update(TEXT_OVERRIDES.get(arch, {}))
    config.update(OVERRIDES.get(arch, {}))
    return config


def _fill(args_cls, model_type: str, sizes: dict = SIZES, flip_tie: bool = False) -> dict:
    out = {}
    hints = _hints(args_cls)
    for f in dataclasses.fields(args_cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name == "model_type":
            out[f.name] = model_type
        elif f.name in ("text_config", "vision_config", "quantization", "rope_scaling"):
            if required:
                out[f.name] = None
        elif f.name == "tie_word_embeddings" and flip_tie:
            out[f.name] = not (f.default if isinstance(f.default, bool) else True)
        elif f.name in sizes:
            out[f.name] = sizes[f.name]
        elif required and f.name in REQUIRED:
            out[f.name] = REQUIRED[f.name]
        elif required:
            out[f.name] = _from_type(f.name, hints.get(f.name, f.type))
    return out


def _hints(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a forward reference the module never resolves: fall back to raw types
        return {}


def _from_type(name: str, tp: Any) -> Any:
    """A value for a required field nothing else names, from its type (and name)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        tp = [a for a in typing.get_args(tp) if a is not type(None)][0]  # Optional[X]: an X
        origin = typing.get_origin(tp)
    if tp is bool:
        return False
    if tp is int:
        return 16 if re.search(r"dim|size|rank", name) else 2
    if tp is float:
        return 1e-5 if "eps" in name else 1.0
    if tp is str:
        return "silu" if "act" in name else ""
    if origin in (list, tuple) or tp in (list, tuple):
        return []
    if origin is dict or tp is dict:
        return {}
    return None


def _text_args(module) -> Optional[type]:
    """The dataclass a wrapper module builds its language model's args from, if it has one: found
    where the module (or a base class of its Model, from another module) calls `X.from_dict(...text_config`."""
    names = {f.name for f in dataclasses.fields(module.ModelArgs)}
    if "text_config" not in names:
        return None
    modules = [module] + [importlib.import_module(c.__module__) for c in module.Model.__mro__
                          if c.__module__.startswith("mlx_lm.models.")]
    for mod in modules:
        source = Path(mod.__file__).read_text()
        for match in re.finditer(r"([\w.]+)\.from_dict\(\s*[\w.]*text_config", source):
            obj: Any = mod
            for part in match.group(1).split("."):
                obj = getattr(obj, part, None)
            if dataclasses.is_dataclass(obj):
                return obj
    return None
