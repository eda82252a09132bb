"""Load progress: the phases a real load goes through, and the GGUF conversion's fraction."""

from mlx_nb.models import load_model
from mlx_nb.models.progress import LoadProgress, describe, reporting


class Recorder(LoadProgress):
    """Every report, in order (what a status reader polling at any moment could see)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def set(self, phase, done=None, total=None):
        super().set(phase, done, total)
        self.seen.append((phase, self.to_dict()["fraction"]))


def test_a_first_gguf_load_reports_conversion_progress(tmp_path, monkeypatch):
    from test_gguf import LAYERS, _tiny_gguf

    monkeypatch.setenv("MLX_NB_HOME", str(tmp_path / "home"))  # nothing converted yet: the conversion runs
    progress = Recorder()
    with reporting(progress):
        load_model(str(_tiny_gguf(tmp_path / "tiny.gguf")))
    phases = list(dict.fromkeys(phase for phase, _ in progress.seen))
    assert phases[:3] == ["resolving", "converting GGUF", "loading weights"], phases
    fractions = [f for phase, f in progress.seen if phase == "converting GGUF" and f is not None]
    tensors = 2 + 9 * LAYERS
    assert fractions == [(i + 1) / tensors for i in range(tensors)]  # one report per tensor written
    line = describe({"model": "m", "load": progress.to_dict()})
    assert line.startswith(f"loading m: {progress.phase}")


def test_an_engine_reports_its_load_in_status():
    from mlx_nb.engine import Engine

    with Engine("tiny-llama", wait=True) as engine:
        load = engine.status()["load"]
        assert load["phase"] == "ready" and load["elapsed_s"] > 0 and load["fraction"] is None
    progress = Recorder()
    with reporting(progress):
        load_model("tiny-llama")
    assert [p for p, _ in progress.seen][:2] == ["resolving", "loading weights"]
