"""The registry's policy (mlx_nb/registry.py) on a clock the test moves: what is unloaded when, and
what is refused. Its engines are stand-ins that record being closed; the real engines behind the
same policy are tests/server/test_server_models.py's."""

import pytest

from mlx_nb.registry import ModelRegistry, ModelUnavailable, entries_from, keep_alive_seconds

MB = 2**20


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """What the registry reads of an Engine: readiness, idleness, weights and adapters, closing."""

    def __init__(self, source: str):
        self.model_name, self.load_error, self.ready, self.closed, self.idle = source, None, True, False, True
        self.loaded, self.weights_bytes, self.adapter_bytes = object(), 10 * MB, 0

    def close(self):
        self.closed = True


def registry(budget_mb: int, keep_alive_s: float = 60.0):
    clock = Clock()
    reg = ModelRegistry({"a": "a-src", "b": "b-src", "c": "c-src"}, StandIn, budget_mb * MB, keep_alive_s,
                        prefix_bytes=lambda engine: 0, clock=clock)
    for entry in reg.entries.values():
        entry.estimate = 10 * MB
    reg.pin("default", StandIn("default-src"))
    return reg, clock


def test_keep_alive_per_request_forever_zero_and_the_servers():
    reg, clock = registry(100, keep_alive_s=60)
    a, b, c = (reg.engine_for(n) for n in "abc")
    reg.keep_alive("a", -1)  # never expires
    reg.keep_alive("b", 0)  # expires as soon as it is idle
    clock.now = 1
    assert reg.sweep() == ["b"] and b.closed
    clock.now = 59
    assert reg.sweep() == []
    clock.now = 61  # past the server's 60 s for c; a stays
    assert reg.sweep() == ["c"] and c.closed and not a.closed
    clock.now = 10**6
    assert reg.sweep() == [] and reg.entries["a"].engine is a
    assert reg.entries["default"].engine is not None  # pinned


def test_a_busy_model_is_never_unloaded_and_its_idle_time_starts_when_it_ends():
    reg, clock = registry(100, keep_alive_s=10)
    a = reg.engine_for("a")
    a.idle = False
    clock.now = 100
    assert reg.sweep() == []  # busy: its last use is now
    a.idle = True
    clock.now = 105
    assert reg.sweep() == []
    clock.now = 111
    assert reg.sweep() == ["a"]


def test_room_is_made_from_the_least_recently_used_idle_model_and_refused_when_busy_or_too_big():
    reg, clock = registry(35)  # the default's 10 MB and two more
    a = reg.engine_for("a")
    clock.now = 1
    b = reg.engine_for("b")
    clock.now = 2
    reg.engine_for("a")  # a used after b: b is the least recently used
    clock.now = 3
    c = reg.engine_for("c")
    assert b.closed and not a.closed and reg.entries["b"].engine is None and reg.entries["b"].unloaded == 1
    a.idle = c.idle = False
    with pytest.raises(ModelUnavailable, match="busy or pinned"):
        reg.engine_for("b")
    reg.entries["b"].estimate = 100 * MB
    with pytest.raises(ModelUnavailable, match="more than the whole memory budget"):
        reg.engine_for("b")
    assert reg.used_bytes() <= reg.budget_bytes


def test_a_models_draft_counts_against_the_budget_before_and_after_it_loads(tmp_path):
    """Before a load the estimate adds the draft's file to the model's; once loaded, the engine's
    weights (which Engine.weights_bytes gives with its draft's) are what is counted."""
    model, draft = tmp_path / "model.gguf", tmp_path / "draft.gguf"
    model.write_bytes(b"\0" * (8 * MB))
    draft.write_bytes(b"\0" * (4 * MB))
    for drafts, fits in (({}, True), ({"a": str(draft)}, False)):
        reg = ModelRegistry({"a": str(model)}, StandIn, 20 * MB, 60.0, prefix_bytes=lambda engine: 0,
                            clock=Clock(), drafts=drafts)
        reg.pin("default", StandIn("default-src"))  # 10 MB held: 8.4 MB more fits, 12.6 MB does not
        assert reg.entries["a"].estimate == (12 if drafts else 8) * MB
        if fits:
            assert reg.engine_for("a").model_name == str(model)
        else:
            with pytest.raises(ModelUnavailable, match="needs about 12"):
                reg.engine_for("a")
    engine = reg.entries["default"].engine
    engine.weights_bytes = 15 * MB  # a loaded default whose draft grew what it holds
    assert reg.used_bytes() == 15 * MB


def test_a_failed_load_is_swept_and_tried_again():
    reg, clock = registry(100)
    a = reg.engine_for("a")
    a.load_error, a.ready = ValueError("no config.json"), False
    assert [m for m in reg.describe() if m["name"] == "a"][0]["error"] == "no config.json"
    assert reg.sweep() == ["a"] and reg.entries["a"].unloaded == 0
    assert reg.engine_for("a") is not a


def test_entries_and_keep_alive_spellings(tmp_path):
    (tmp_path / "models" / "mistral").mkdir(parents=True)
    (tmp_path / "models" / "mistral" / "config.json").write_text("{}")
    (tmp_path / "models" / "phi.Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "models" / "notes.txt").write_text("not a model")
    got = entries_from(["tiny-gemma3", f"mine={tmp_path / 'models' / 'mistral'}", str(tmp_path / "models")])
    assert got == {"tiny-gemma3": "tiny-gemma3", "mine": str(tmp_path / "models" / "mistral"),
                   "mistral": str(tmp_path / "models" / "mistral"),
                   "phi.Q4_K_M": str(tmp_path / "models" / "phi.Q4_K_M.gguf")}
    assert [keep_alive_seconds(v) for v in (None, 5, "90s", "5m", "1h", "250ms", "-1", 0)] == [
        None, 5.0, 90.0, 300.0, 3600.0, 0.25, -1.0, 0.0]
    for bad in ("soon", True, "5 minutes"):
        with pytest.raises(ValueError, match="keep_alive"):
            keep_alive_seconds(bad)
