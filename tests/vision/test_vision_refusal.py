"""A family that cannot join a shared decode batch is refused at load, in one line naming the family
and the reason, never at request time; a family the matrix has never seen loads, with a warning."""

import json
import logging

import pytest

from mlx_nb import Engine
from mlx_nb.models import ModelLoadError, load_model
from mlx_nb.models.vision import COMPAT_FILE, VisionFamilyRefused

MATRIX = {e["architecture"]: e for e in json.loads(COMPAT_FILE.read_text())["entries"]}


def test_mllama_is_refused_at_load_with_the_matrix_reason():
    """Llama 3.2 Vision reads the image through cross-attention states that mlx_vlm carries from
    one decode step to the next, per request: a batch row has nowhere to keep them."""
    with pytest.raises(VisionFamilyRefused) as info:
        load_model("tiny-mllama")
    message = str(info.value)
    assert "\n" not in message and "'mllama'" in message and MATRIX["mllama"]["reason"] in message
    assert "cross_attention_states" in message
    engine = Engine("tiny-mllama")
    with pytest.raises(ModelLoadError, match="'mllama' cannot be batched"):
        engine.wait_ready(timeout=120)
    engine.close()


def test_without_the_matrix_the_structure_still_refuses_it(monkeypatch):
    monkeypatch.setenv("MLX_NB_VISION_COMPAT", "")  # no verdict file at all
    with pytest.raises(VisionFamilyRefused, match="cross_attention_states from step to step"):
        load_model("tiny-mllama")


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    """The committed matrix with LLaVA refused and Pixtral never swept, selected as users select one."""
    document = json.loads(COMPAT_FILE.read_text())
    for entry in document["entries"]:
        if entry["architecture"] == "llava":
            entry.update(verdict="refused", reason="a reason the sweep found")
    document["entries"] = [e for e in document["entries"] if e["architecture"] != "pixtral"]
    path = tmp_path / "mlx_vlm.json"
    path.write_text(json.dumps(document))
    monkeypatch.setenv("MLX_NB_VISION_COMPAT", str(path))
    return path


def test_a_family_the_matrix_refuses_is_refused_with_the_matrix_reason(matrix):
    with pytest.raises(VisionFamilyRefused, match="'llava' cannot be batched: a reason the sweep found$"):
        load_model("tiny-llava")


def test_family_the_matrix_never_saw_loads_with_a_warning(matrix, caplog):
    with caplog.at_level(logging.WARNING, logger="mlx_nb.models"):
        loaded = load_model("tiny-pixtral")
    assert loaded.kind == "vision"
    assert any("'pixtral' is not in the compatibility sweep" in r.getMessage() for r in caplog.records)
