"""A family the compatibility matrix refuses is refused at load, in one line naming the family and
the matrix's reason, never at request time; a family the matrix has never seen loads, with a warning."""

import json
import logging

import pytest

from mlx_nb import Engine
from mlx_nb.models import ModelLoadError, load_model
from mlx_nb.models.vision import COMPAT_FILE

REASON = "batched output differs from mlx_vlm generate (late_join): engine [1] != mlx_vlm generate [2]"


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    """The committed matrix with LLaVA refused and Pixtral never swept, selected as users select one."""
    document = json.loads(COMPAT_FILE.read_text())
    for entry in document["entries"]:
        if entry["architecture"] == "llava":
            entry.update(verdict="refused", reason=REASON)
    document["entries"] = [e for e in document["entries"] if e["architecture"] != "pixtral"]
    path = tmp_path / "mlx_vlm.json"
    path.write_text(json.dumps(document))
    monkeypatch.setenv("MLX_NB_VISION_COMPAT", str(path))
    return path


def test_refused_family_fails_at_load_with_the_matrix_reason(matrix):
    with pytest.raises(ModelLoadError) as info:
        load_model("tiny-llava")
    message = str(info.value)
    assert "\n" not in message and "'llava'" in message and REASON in message
    engine = Engine("tiny-llava")
    with pytest.raises(ModelLoadError, match="cannot be batched"):
        engine.wait_ready(timeout=120)
    engine.close()


def test_family_the_matrix_never_saw_loads_with_a_warning(matrix, caplog):
    with caplog.at_level(logging.WARNING, logger="mlx_nb.models"):
        loaded = load_model("tiny-pixtral")
    assert loaded.kind == "vision"
    assert any("'pixtral' is not in the compatibility sweep" in r.getMessage() for r in caplog.records)


def test_committed_matrix_serves_its_batched_families(monkeypatch):
    monkeypatch.delenv("MLX_NB_VISION_COMPAT", raising=False)
    assert load_model("tiny-llava").kind == "vision"
