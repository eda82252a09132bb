"""The module swap on real models: what it puts on the kernels, that the swapped model computes what
the original does, and that modules it cannot prove equal are left alone."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_nb.kernels import layers
from mlx_nb.kernels.swap import swap_model
from mlx_nb.models.loader import load_model


def _bytes(module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm2_float32():
    """The model as it ran before the kernels: dequantized to float32."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLX_NB_DTYPE", "float32")
        return load_model("smollm2-135m-instruct")


def test_default_model_runs_on_kernels_in_under_150_mb(smollm2):
    assert smollm2.dtype == "kernels"
    assert smollm2.formats == {"Q4_1": 210, "Q8_0": 1}  # the GGUF's blocks, packed as they are at load
    swapped = smollm2.kernels["swapped"]
    assert swapped == {"rms_norm": 61, "rope": 30, "swiglu mlp": 30, "attention": 30, "decoder layer": 30}
    assert smollm2.kernels["kept"] == {}
    assert _bytes(smollm2.model) < 150e6  # the GGUF's own 4/8-bit weights, packed (float32 was 538 MB)
    assert isinstance(smollm2.model.model.embed_tokens, layers.QEmbedding)  # the tied output layer too
    assert isinstance(smollm2.model.model.layers[0], layers.Block)
    assert smollm2.model.model.layers[0].use_sliding is False  # the layer's own attributes carried over


def test_default_model_agrees_with_float32(smollm2, smollm2_float32):
    tok = smollm2.tokenizer
    text = "The capital of France is Paris. The capital of Italy is Rome. Water boils at one hundred degrees."
    ids = mx.array(tok.encode(text))[None]
    a, b = smollm2.model(ids), smollm2_float32.model(ids)
    assert float(mx.abs(a - b).max() / mx.abs(b).max()) < 0.02  # two activation digits (kernels.precision)
    assert float((mx.argmax(a, -1) == mx.argmax(b, -1)).mean()) >= 0.95
    assert _bytes(smollm2_float32.model) > 500e6


@pytest.mark.parametrize("bits", [4, 8])
def test_float_checkpoint_quantized_on_request(bits):
    loaded = load_model("tiny-llama", quantize=bits)
    swapped = loaded.kernels["swapped"]
    assert swapped[f"float linear quantized to {bits} bits"] > 0
    assert isinstance(loaded.model.model.layers[0].self_attn, layers.Attention)
    assert isinstance(loaded.model.model.layers[0].self_attn.qkv, layers.QLinear)
    reference = load_model("tiny-llama", quantize=None)
    assert "float linear quantized to 8 bits" not in reference.kernels["swapped"]
    ids = mx.array([[1, 5, 9, 13, 2, 7]])
    a, b = loaded.model(ids), reference.model(ids)
    tol = 0.05 if bits == 8 else 0.3  # the weights' own quantization, not the kernels
    assert float(mx.linalg.norm(a - b) / mx.linalg.norm(b)) < tol


def test_modules_that_differ_are_left_alone():
    class GeluMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(64, 96), nn.Linear(64, 96), nn.Linear(96, 64)

        def __call__(self, x):
            return self.down_proj(nn.gelu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = GeluMLP()
            self.norm = nn.RMSNorm(64)
            self.layer_norm = nn.LayerNorm(64)

    block = Block()
    report = swap_model(block)
    assert isinstance(block.mlp, GeluMLP)  # checked against the original and refused
    assert report["kept"] == {"mlp kept (not a plain SwiGLU)": 1}
    assert isinstance(block.norm, layers.RMSNorm) and isinstance(block.layer_norm, nn.LayerNorm)


def test_unsupported_quantization_is_dequantized(tmp_path):
    lin = nn.Linear(64, 32)
    q3 = nn.QuantizedLinear.from_linear(lin, group_size=32, bits=3)

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = q3

    holder = Holder()
    report = swap_model(holder)
    assert report["kept"] == {"3-bit weights (dequantized to float32)": 1}
    assert type(holder.proj) is nn.Linear and holder.proj.weight.dtype == mx.float32
    x = mx.array(np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32))
    assert float(mx.abs(holder.proj(x) - q3(x)).max()) < 1e-4


def test_activation_digits_follow_the_model_size_and_the_setting(smollm2, monkeypatch):
    """Small models keep two int8 digits of each activation (their greedy choices are fragile),
    large ones one (llama.cpp's); MLX_NB_ACTIVATIONS overrides; every packed weight agrees."""
    from mlx_nb.kernels import precision

    assert smollm2.kernels["activations"] == "int16 (two int8 digits)"
    assert {m.digits for _, m in smollm2.model.named_modules() if isinstance(m, layers.Packed)} == {2}
    assert precision.digits_for(135_000_000) == 2 and precision.digits_for(1_200_000_000) == 1
    monkeypatch.setenv("MLX_NB_ACTIVATIONS", "int8")
    assert precision.set_activation_digits(smollm2.model) == "int8"
    assert {m.digits for _, m in smollm2.model.named_modules() if isinstance(m, layers.Packed)} == {1}
    monkeypatch.setenv("MLX_NB_ACTIVATIONS", "int16")
    assert precision.digits_for(3_000_000_000) == 2
    monkeypatch.setenv("MLX_NB_ACTIVATIONS", "fast")
    with pytest.raises(ValueError, match="int8, int16 or auto"):
        precision.digits_for(1)
    monkeypatch.delenv("MLX_NB_ACTIVATIONS")
    precision.set_activation_digits(smollm2.model)  # as loaded, for the tests after this one


@pytest.mark.parametrize("batched", [False, True])
def test_keys_written_in_place_equal_mlx_lms_cache_update(smollm2, monkeypatch, batched):
    """The fused attention writes each step's keys and values into mlx_lm's KVCache / BatchKVCache
    buffers itself; mlx_lm's own update_and_fetch is the reference. A prompt, then steps across the
    buffers' growth (every 256 keys) and a left-padded batch: logits and every cache field must be
    exactly what update_and_fetch gives, and no step may copy a cache."""
    from mlx_lm.models.cache import BatchKVCache, KVCache

    from mlx_nb.kernels import native

    model = smollm2.model
    rng = np.random.default_rng(5)
    rows = 2 if batched else 1
    prompt = mx.array(rng.integers(0, 1000, (rows, 250)).astype(np.int32))
    steps = mx.array(rng.integers(0, 1000, (rows, 12)).astype(np.int32))

    def run(in_place: bool):
        if not in_place:
            monkeypatch.setattr(layers, "_write_at", lambda cache, tokens: None)
        cache = [BatchKVCache([3, 0]) if batched else KVCache() for _ in model.layers]
        logits = [model(prompt, cache=cache)]
        mx.eval(logits, [c.state for c in cache])
        copies = native().qkv_rope_cache_copies()
        for i in range(steps.shape[1]):
            logits.append(model(steps[:, i:i + 1], cache=cache))
            mx.eval(logits[-1])
        copied = native().qkv_rope_cache_copies() - copies
        monkeypatch.undo()
        fields = [(c.offset, getattr(c, "_idx", None), c.keys, c.values) for c in cache]
        return logits, fields, copied

    (got, got_fields, copied), (want, want_fields, _) = run(True), run(False)
    assert copied == 0
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want))
    assert want_fields[0][2].shape[2] > 256  # the steps crossed a growth of the buffers
    for g, w in zip(got_fields, want_fields):
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(g, w))
