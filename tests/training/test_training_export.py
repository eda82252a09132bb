"""A fine-tune taken elsewhere (mlx_nb/training/export.py): the adapter fused into its base as an MLX
folder that mlx_lm loads, and as a GGUF of a GGUF base that this project's converter reads back.
The references are independent of the fusing: mlx_lm's own model with the adapter on top
(`load(base, adapter_path=...)`, unfused), and a float64 NumPy check of what Q8_0 may round."""

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_nb.client.streams import ClientError
from mlx_nb.client.training import TrainJob
from mlx_nb.models.gguf import convert_gguf
from mlx_nb.models.gguf_load import load_gguf_dir
from mlx_nb.models.loader import read_config
from mlx_nb.models.sources import resolve
from mlx_nb.training.manager import TrainManager
from mlx_nb.training.worker import trainable_model

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from gguf_files import byte_level_vocab, tiny_config, write_pair  # noqa: E402

ROWS = [{"prompt": f"{i} plus {i}", "completion": f"{2 * i} and that is all"} for i in range(24)]


def trained(home: Path, base: str, name: str) -> TrainJob:
    manager = TrainManager(home)
    job = manager.create(ROWS, base, name, iters=4, steps_per_save=100, learning_rate=3e-2, num_layers=-1)
    assert manager.wait(job, timeout=300)["status"] == "completed"
    manager.close()
    return TrainJob(manager, job)


def relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30))


def rounded(w: np.ndarray, kind: str) -> np.ndarray:
    import gguf

    if kind == "F16":
        return w.astype(np.float16).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).astype(np.float32)


def with_adapter(base: str, folder: str):
    """The base (as trained) with the adapter's LoRA layers on top, unfused: mlx_lm's own layers."""
    from mlx_lm.tuner.utils import load_adapters

    model, _ = trainable_model(base)
    return load_adapters(model, folder)


def test_the_fused_folder_loads_in_mlx_lm_and_computes_what_the_adapter_on_its_base_computes(tmp_path):
    job = trained(tmp_path / "home", "tiny-llama", "fused")
    folder = job.export(tmp_path / "fused")
    fused, _ = mlx_lm.load(str(folder))
    reference = with_adapter("tiny-llama", job.manager.served(job.id)["fused"])
    base, _ = mlx_lm.load(str(resolve("tiny-llama")))
    ids = mx.array([np.random.default_rng(0).integers(3, 200, 24).tolist()])
    want, got = reference(ids), fused(ids)
    assert relative(want, got) < 1e-4
    assert relative(want, base(ids)) > 1e-2, "the adapter changes nothing"
    assert not (Path(folder) / "config.json").read_text().count('"gguf"')
    adapter_only = job.export(tmp_path / "adapter", fuse=False)
    assert sorted(p.name for p in Path(adapter_only).iterdir()) == ["adapter_config.json", "adapters.safetensors",
                                                                      "state.json"]
    with pytest.raises(ClientError, match="exists: pick a new path"):
        job.export(tmp_path / "fused")
    with pytest.raises(ClientError, match="did not come from a GGUF file"):
        job.export(tmp_path / "x.gguf", format="gguf")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_gguf_base_exports_a_gguf_that_reads_back_as_the_fused_model(arch, tmp_path):
    rng = np.random.default_rng(7)
    source = tmp_path / f"{arch}.gguf"
    write_pair(arch, tiny_config(arch, rng), byte_level_vocab(), source, rng)
    job = trained(tmp_path / "home", str(source), "g")
    reference = with_adapter(str(source), job.manager.served(job.id)["g"])
    ids = mx.array([rng.integers(3, 200, 24).tolist()])
    want = reference(ids)
    fused = None
    for kind in ("F32", "F16", "Q8_0"):
        out = Path(job.export(tmp_path / f"{arch}-{kind}.gguf", format="gguf", quantize=kind))
        back = convert_gguf(out, tmp_path / f"{arch}-{kind}", progress=False)
        config = read_config(back)
        if "gguf" in config:  # block types: dequantized to float32
            model, _, formats = load_gguf_dir(back, config, kernels=False)
        else:  # an all-float file converts to a plain MLX folder
            (model, _), formats = mlx_lm.load(str(back)), {}
        weights = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
        if kind == "F32":  # the fused model itself: what the base with the adapter on top computes
            model.set_dtype(mx.float32)
            assert relative(want, model(ids)) < 1e-5
            fused = weights
            continue
        for name, w in weights.items():  # each matrix rounded exactly as the type rounds it (gguf-py's codec)
            assert w.shape == fused[name].shape
            expect = fused[name] if w.ndim < 2 else rounded(fused[name], kind)
            assert np.array_equal(w, expect), (kind, name, np.abs(w - expect).max())
        if kind == "Q8_0":  # the matrices in the type asked (norms stay float, as llama.cpp writes them)
            assert formats and all(k.startswith("Q8_0") for k in formats), formats
    with pytest.raises(ClientError, match="format must be"):
        job.export(tmp_path / "y", format="onnx")
    assert json.loads((tmp_path / "home" / "training" / "jobs" / job.id / "job.json").read_text())["status"] == \
        "completed"
