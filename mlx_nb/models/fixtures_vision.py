"""Tiny random-weight vision-language models (mlx_vlm), one per family, for tests of vision batching.

Their output is noise (random weights, N(0, 0.25) like the text fixtures): they exist to prove that
a vision request, prefilled alone and then moved into the shared batch, gives exactly the tokens
mlx_vlm's own generation gives it alone, for every family (fixtures_vision_families.py).

Each is written as a directory `mlx_vlm.utils.load` reads offline: config.json, model.safetensors,
the byte-level tokenizer with the family's image markers and a strict ChatML template writing the
family's image placeholder, and the processor's own config files.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from mlx_nb.models.fixtures_vision_families import FAMILIES, resolved_config, vocabulary
from mlx_nb.models.templates import STRICT_CHATML
from mlx_nb.models.tiny_tokenizer import write_tokenizer

VISION_CONFIGS = FAMILIES  # fixture name -> VisionFamily
BIAS_SCALE = 0.02


def _template(name: str) -> str:
    family = FAMILIES[name]
    if family.template is not None:
        return family.template
    return STRICT_CHATML.replace("<|vision_start|><|image_pad|><|vision_end|>", family.placeholder)


def vision_spec(name: str) -> list:
    """What the built directory depends on besides the tokenizer (fixtures.fingerprint hashes it)."""
    family = FAMILIES[name]
    return [resolved_config(family), family.preprocessor, family.processor, family.tokenizer_config,
            vocabulary(family), _template(name), family.embed_scale, BIAS_SCALE, "norms centred on 1"]


def build_vision(name: str, out: Path, seed: int, scale: float) -> None:
    """Write fixture `name` into the (temporary) directory `out`; `fixtures.build_tiny` calls it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    family = FAMILIES[name]
    config = resolved_config(family)
    arch, _ = get_model_and_args(copy.deepcopy(config))
    spec = copy.deepcopy(config)  # built as mlx_vlm.utils.load_model builds it
    spec.setdefault("text_config", spec.pop("llm_config", {}))
    spec.setdefault("vision_config", {})
    model_config = arch.ModelConfig.from_dict(spec)
    model_config = update_module_configs(model_config, arch, spec, ["text", "vision"])
    model = arch.Model(model_config)
    rng = np.random.default_rng(seed)
    weights = {}
    for key, value in tree_flatten(model.parameters()):
        std = scale
        if key.endswith(".bias"):  # a large random bias adds one vector everywhere: outputs stop depending on inputs
            std = BIAS_SCALE
        elif family.embed_scale and key.endswith("embed_tokens.weight"):
            std = family.embed_scale
        w = rng.normal(0.0, std, size=value.shape).astype(np.float32)
        # Norm scales centred on 1 (as trained models have them): with scales near 0 the attention
        # is near-uniform, positions barely move a logit, and a wrong position (a lost rope delta)
        # would go unnoticed by the token-for-token tests.
        weights[key] = mx.array(w + 1.0 if key.endswith("norm.weight") else w)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if family.preprocessor is not None:
        (out / "preprocessor_config.json").write_text(json.dumps(family.preprocessor, indent=2))
    (out / "processor_config.json").write_text(json.dumps(family.processor, indent=2))
    write_tokenizer(out, _template(name), family.tokenizer_config, extra=vocabulary(family))
