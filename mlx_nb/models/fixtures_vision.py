"""Tiny random-weight vision-language models (mlx_vlm), for tests of vision batching.

Their output is noise (random weights, N(0, 0.25) like the text fixtures): they exist to prove that
a vision request, prefilled alone and then moved into the shared batch, gives exactly the tokens
it gives alone. Two layouts:

- `tiny-qwen3.5-vl`: mlx_vlm qwen3_5, a vision tower over a HYBRID language model (ArraysCache +
  KVCache layers), text dims as `tiny-qwen3.5`;
- `tiny-qwen3-vl`: mlx_vlm qwen3_vl, the same vision tower family over a pure-KVCache language model.

Each is written as a directory `mlx_vlm.utils.load` reads offline: config.json (with vision_config
and the image/vision token ids of `tiny_tokenizer`), model.safetensors, the byte-level tokenizer
with the strict Qwen-like chat template, and preprocessor_config.json for the Qwen-VL image processor.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from mlx_nb.models.templates import STRICT_CHATML
from mlx_nb.models.tiny_tokenizer import VOCAB_SIZE, special_id, write_tokenizer

_EOS = special_id("<|im_end|>")

_TOKEN_IDS = {
    "image_token_id": special_id("<|image_pad|>"),
    "video_token_id": special_id("<|video_pad|>"),
    "vision_start_token_id": special_id("<|vision_start|>"),
    "vision_end_token_id": special_id("<|vision_end|>"),
    "vocab_size": VOCAB_SIZE,
    "eos_token_id": _EOS,
    "tie_word_embeddings": True,
}

_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "out_hidden_size": 64,
    "num_heads": 2,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 16,
    "in_channels": 3,
}

_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "vocab_size": VOCAB_SIZE,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "eos_token_id": _EOS,
}

VISION_CONFIGS: dict[str, dict] = {
    "tiny-qwen3.5-vl": {
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text",
            "num_hidden_layers": 4,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 2,
            "rope_parameters": {
                "mrope_section": [2, 1, 1],
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "rope_type": "default",
            },
            **_TEXT,
        },
        "vision_config": {"model_type": "qwen3_5", **_VISION},
        **_TOKEN_IDS,
    },
    "tiny-qwen3-vl": {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "num_hidden_layers": 2,
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True},
            **_TEXT,
        },
        "vision_config": {"model_type": "qwen3_vl", "deepstack_visual_indexes": [], **_VISION},
        **_TOKEN_IDS,
    },
}

# The Qwen-VL image processor: 14-px patches merged 2x2, so a 56x56 image is 4 tokens. The pixel
# cap keeps any test image small (at most 64 image tokens).
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 28 * 28,
    "max_pixels": 224 * 224,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
}


_QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def vision_spec(name: str) -> list:
    """What the built directory depends on besides the tokenizer (fixtures.fingerprint hashes it)."""
    return [VISION_CONFIGS[name], PREPROCESSOR, STRICT_CHATML, _QK_NORMS]


def build_vision(name: str, out: Path, seed: int, scale: float) -> None:
    """Write fixture `name` into the (temporary) directory `out`; `fixtures.build_tiny` calls it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    config = VISION_CONFIGS[name]
    arch, _ = get_model_and_args(copy.deepcopy(config))
    model_config = arch.ModelConfig.from_dict(copy.deepcopy(config))
    model_config = update_module_configs(model_config, arch, copy.deepcopy(config), ["text", "vision"])
    model = arch.Model(model_config)
    rng = np.random.default_rng(seed)
    weights = {}
    for key, value in tree_flatten(model.parameters()):
        w = rng.normal(0.0, scale, size=value.shape).astype(np.float32)
        # Attention q/k norms centred on 1 (as trained models have them): with weights near 0 the
        # attention is near-uniform, positions barely move a logit, and a wrong mRoPE position
        # would go unnoticed by the token-for-token tests.
        weights[key] = mx.array(w + 1.0 if key.endswith(_QK_NORMS) else w)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    write_tokenizer(out, STRICT_CHATML)
