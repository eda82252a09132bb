"""Tiny random-weight models, one per cache layout the engine must batch.

Their output is noise by nature (random weights): they exist to prove that batching, caching and
streaming give exactly the tokens a one-at-a-time run gives. Built deterministically on first use
into the model cache and then loaded by the same path as real models.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlx_nb.models.atomic import build_atomically
from mlx_nb.models.fixtures_vision import VISION_CONFIGS, build_vision, vision_spec
from mlx_nb.models.templates import HARMONY, HARMONY_TOKENS, LENIENT_CHATML, STRICT_CHATML, THINKING_CHATML
from mlx_nb.models.tiny_tokenizer import VOCAB_SIZE, write_tokenizer

_COMMON = {"vocab_size": VOCAB_SIZE, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
# the two-layer attention shape most fixtures share
_SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 4096}

TINY_CONFIGS: dict[str, dict] = {
    "tiny-llama": {"model_type": "llama", **_SMALL, **_COMMON},
    "tiny-qwen3.5": {
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "mrope_section": [2, 1, 1],
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "rope_type": "default",
            },
            **_COMMON,
        },
        "tie_word_embeddings": True,
    },
    "tiny-gemma3": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
        "max_position_embeddings": 4096,
        **_COMMON,
    },
    "tiny-falcon-h1": {
        "model_type": "falcon_h1",
        **_SMALL,
        "head_dim": 16,
        "mamba_d_conv": 4,
        "mamba_d_head": 16,
        "mamba_d_ssm": 64,
        "mamba_d_state": 16,
        "mamba_n_groups": 1,
        "mamba_n_heads": 4,
        "mamba_chunk_size": 16,
        **_COMMON,
    },
    # thinking models: their templates write reasoning markers (engine/text/reasoning.py)
    "tiny-qwen3-think": {
        "model_type": "qwen3",
        **_SMALL,
        "head_dim": 16,
        "rope_theta": 10000.0,
        **_COMMON,
    },
    "tiny-gpt-oss": {
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 4096,
        "rope_theta": 10000,
        **_COMMON,
    },
}

_TEMPLATES = {
    "tiny-llama": LENIENT_CHATML,
    "tiny-qwen3.5": STRICT_CHATML,
    "tiny-gemma3": LENIENT_CHATML,
    "tiny-falcon-h1": LENIENT_CHATML,
    "tiny-qwen3-think": THINKING_CHATML,
    "tiny-gpt-oss": HARMONY,
}

# Fixtures whose tokenizer adds special tokens of its own, and what ends their replies.
_EXTRA_TOKENS = {"tiny-gpt-oss": (HARMONY_TOKENS, {"eos_token": "<|return|>"})}

# Thinking fixtures taught one reasoning-then-answer reply (fixture_teaching.py), by family. Their
# recommended sampling (generation_config.json) is greedy: a request that leaves it out, as the Lab's
# chats do, gets the taught reply itself; one sampled at temperature 1 stays near it, not on it.
TAUGHT = {"tiny-qwen3-think": "think", "tiny-gpt-oss": "harmony"}
TAUGHT_SAMPLING = {"temperature": 0.0}

WEIGHT_SCALE = 0.25  # large enough that greedy argmax is decisive, not a near-tie between tokens


def tiny_names() -> list[str]:
    """Text fixtures first (one per cache layout), then one vision fixture per mlx-vlm family."""
    return [*sorted(TINY_CONFIGS), *sorted(VISION_CONFIGS)]


def fingerprint(name: str) -> str:
    """Changes whenever the fixture's definition does, so a stale cached build is never reused."""
    import hashlib

    from mlx_nb.models.tiny_tokenizer import SPECIAL_TOKENS

    from mlx_nb.models import fixture_teaching as teaching

    taught = ([teaching.REPLIES[TAUGHT[name]], teaching.HELD_OUT, teaching.TRAINING, TAUGHT_SAMPLING]
              if name in TAUGHT else None)
    parts = vision_spec(name) if name in VISION_CONFIGS else [TINY_CONFIGS[name], _TEMPLATES[name],
                                                               repr(_EXTRA_TOKENS.get(name)), taught]
    spec = json.dumps([*parts, WEIGHT_SCALE, SPECIAL_TOKENS], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:10]


def build_tiny(name: str, dest: Path) -> Path:
    """Build fixture `name` into `dest` (atomically); returns `dest`."""
    if name in VISION_CONFIGS:
        return build_atomically(dest, lambda tmp: build_vision(name, tmp, _seed(name), WEIGHT_SCALE))
    if name not in TINY_CONFIGS:
        raise KeyError(name)
    extra, tokenizer_config = _EXTRA_TOKENS.get(name, ((), None))

    def build(tmp: Path) -> None:
        write_random_model(tmp, TINY_CONFIGS[name], _TEMPLATES[name], _seed(name), extra=extra,
                           tokenizer_config=tokenizer_config)
        if name in TAUGHT:
            from mlx_nb.models.fixture_teaching import teach

            teach(tmp, TAUGHT[name], _seed(name))
            (tmp / "generation_config.json").write_text(json.dumps(TAUGHT_SAMPLING))

    return build_atomically(dest, build)


def write_random_model(out: Path, config: dict, chat_template: str, seed: int, extra: tuple = (),
                       tokenizer_config: dict | None = None) -> None:
    """An MLX model directory for any mlx_lm architecture `config` names, with seeded random weights
    and the tiny tokenizer: how every text fixture is made, and how tests make one-off architectures."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")  # one module per architecture
    model = arch.Model(arch.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for key, value in tree_flatten(model.parameters()):
        weights[key] = mx.array(
            rng.normal(0.0, WEIGHT_SCALE, size=value.shape).astype(np.float32)
        )
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(out, chat_template, tokenizer_config, extra=extra)


def _seed(name: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(name))
