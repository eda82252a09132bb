"""How the vision loader follows the matrix: a family whose language model carries per-request state
from step to step (Mllama) is served one request at a time, as is a family the matrix marks
`sequential`; only a family wrong even one request at a time is refused at load, in one line naming
the family and the reason; a family the matrix has never seen loads, with a warning."""

import json
import logging

import pytest

from mlx_nb import Engine
from mlx_nb.models import load_model
from mlx_nb.models.vision import COMPAT_FILE, VisionFamilyRefused

MATRIX = {e["architecture"]: e for e in json.loads(COMPAT_FILE.read_text())["entries"]}


def test_mllama_is_sequential_in_the_matrix_and_by_its_structure(monkeypatch):
    """Llama 3.2 Vision reads the image through cross-attention states that mlx_vlm carries from
    one decode step to the next, per request: a batch row has nowhere to keep them."""
    assert MATRIX["mllama"]["verdict"] == "sequential"
    assert "cross_attention_states" in MATRIX["mllama"]["reason"]
    monkeypatch.setenv("MLX_NB_VISION_COMPAT", "")  # no verdict file at all: the structure says so
    loaded = load_model("tiny-mllama")
    assert "cross_attention_states from step to step" in loaded.sequential


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    """The committed matrix with LLaVA refused, Qwen2-VL sequential and Pixtral never swept,
    selected as users select one."""
    document = json.loads(COMPAT_FILE.read_text())
    for entry in document["entries"]:
        if entry["architecture"] == "llava":
            entry.update(verdict="refused", reason="a reason the sweep found")
        if entry["architecture"] == "qwen2_vl":
            entry.update(verdict="sequential", reason="rows drift when batched")
    document["entries"] = [e for e in document["entries"] if e["architecture"] != "pixtral"]
    path = tmp_path / "mlx_vlm.json"
    path.write_text(json.dumps(document))
    monkeypatch.setenv("MLX_NB_VISION_COMPAT", str(path))
    return path


def test_a_family_the_matrix_refuses_is_refused_with_the_matrix_reason(matrix):
    with pytest.raises(VisionFamilyRefused, match="'llava' cannot be served: a reason the sweep found$"):
        load_model("tiny-llava")


def test_a_family_the_matrix_marks_sequential_is_served_one_request_at_a_time(matrix):
    with Engine("tiny-qwen2-vl", wait=True) as engine:
        policy = engine.status()["policy"]
        assert policy["mode"] == "sequential" and "rows drift when batched" in policy["reason"]
        handles = [engine.submit(messages=[{"role": "user", "content": f"say {w}"}], max_tokens=4) for w in "abc"]
        assert all(h.result(timeout=120).error is None for h in handles)
        assert engine.status()["peak_batch_size"] == 1


def test_family_the_matrix_never_saw_loads_with_a_warning(matrix, caplog):
    with caplog.at_level(logging.WARNING, logger="mlx_nb.models"):
        loaded = load_model("tiny-pixtral")
    assert loaded.kind == "vision"
    assert any("'pixtral' is not in the compatibility sweep" in r.getMessage() for r in caplog.records)
