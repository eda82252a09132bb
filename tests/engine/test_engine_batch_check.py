"""The load-time check on a model's own weights: a batched verdict for caches that are not all plain
KV caches is checked before the engine batches the model's prompts, and overruled when the
prompts read together differ from alone."""

import json
import shutil
from pathlib import Path

import pytest

from mlx_nb import Engine
from mlx_nb.compat.configs import write_tiny
from mlx_nb.engine.batch.batch_probe import cached_check, check, fingerprint
from mlx_nb.engine.batch.batchability import after_check, decide, needs_check
from mlx_nb.models import load_model
from mlx_nb.models.cache_types import cache_type_name


@pytest.fixture(scope="module")
def mamba_dirs(tmp_path_factory):
    """Tiny mamba instances (an SSM state that reads a batch's left padding), three weight draws."""
    root = tmp_path_factory.mktemp("mamba")
    return [write_tiny("mamba", root / f"mamba-{seed}", seed=seed) for seed in (1, 2, 3)]


def test_a_padding_reader_is_caught_whatever_the_weight_draw(mamba_dirs):
    for path in mamba_dirs:
        loaded = load_model(str(path))
        caches = loaded.make_cache()
        # what a matrix measured on some other draw might say
        claimed = decide("mamba", caches, entries={"mamba": {
            "verdict": "batched", "reason": "equal on one draw", "cache_types": [cache_type_name(c) for c in caches]}})
        assert claimed.mode == "batched" and needs_check(claimed, caches)
        result = check(loaded)
        assert not result["agrees"] and result["max_difference"] > 0.01
        policy = after_check(claimed, result)
        assert policy.mode == "prefill_alone" and policy.source == "checked" and policy.check == result


def test_a_model_that_batches_is_confirmed_and_the_check_is_kept(tmp_path):
    loaded = load_model("tiny-qwen3.5")  # gated delta net caches: checked, and they agree
    first = cached_check(loaded, tmp_path)
    assert first["agrees"] and not first["cached"] and first["max_difference"] < 1e-3
    again = cached_check(loaded, tmp_path)
    assert again["cached"] and again["max_difference"] == first["max_difference"]
    assert fingerprint(loaded) in json.loads((tmp_path / "batch_checks.json").read_text())


def test_engine_reports_the_check_and_serves_by_it(mamba_dirs, tmp_path, monkeypatch):
    # A matrix that claims mamba batches (as one lucky draw could): the engine checks and overrules it.
    from mlx_nb.compat import matrix

    data = json.loads((Path(matrix.__file__).parent / "mlx_lm.json").read_text())
    for e in data["entries"]:
        if e["architecture"] == "mamba":
            e.update(verdict="batched", reason="equal on one draw")
    (tmp_path / "mlx_lm.json").write_text(json.dumps(data))
    shutil.copy(Path(matrix.__file__).parent / "mlx_vlm.json", tmp_path / "mlx_vlm.json")
    monkeypatch.setenv("MLX_NB_COMPAT_DIR", str(tmp_path))
    chats = [[{"role": "user", "content": "alpha " * n}] for n in (1, 4, 9)]
    with Engine(str(mamba_dirs[0]), max_batch=4, wait=True) as engine:
        policy = engine.status()["policy"]
        assert policy["mode"] == "prefill_alone" and policy["source"] == "checked"
        assert not policy["check"]["agrees"]
        handles = [engine.submit(messages=c, max_tokens=6) for c in chats]
        batched = [h.result(timeout=120).token_ids for h in handles]
    alone = []
    with Engine(str(mamba_dirs[0]), max_batch=4, wait=True) as engine:
        for c in chats:
            alone.append(engine.submit(messages=c, max_tokens=6).result(timeout=120).token_ids)
    assert batched == alone
    with Engine("tiny-qwen3.5", wait=True) as engine:
        policy = engine.status()["policy"]
        assert policy["mode"] == "batched" and policy["check"]["agrees"]


def test_one_draw_agrees_another_does_not_and_the_check_catches_the_lucky_one(tmp_path):
    """rwkv7's state reads a batch's padding, yet on some weight draws its batched greedy tokens
    still equal generate_step's: a matrix measured on such a draw says `batched`. The sweep's own
    measurement is run on draws until one agrees and one does not (the configs.INSTANCES variants
    first); the instances combined give `prefill_alone`, and on the lucky draw's weights the
    load-time check still finds the difference."""
    from mlx_nb.compat import checks
    from mlx_nb.compat.configs import INSTANCES

    draws = [*INSTANCES.values(), *((seed, {}) for seed in range(1, 9))]
    measured: dict = {}
    for seed, variant in draws:
        path = write_tiny("rwkv7", tmp_path / f"rwkv7-{len(measured)}", seed, variant)
        measured[f"draw {len(measured)}"] = (checks.measure(str(path)), path)
        verdicts = {e["verdict"] for e, _ in measured.values()}
        if "batched" in verdicts and verdicts - {"batched"}:
            break
    assert "batched" in verdicts and verdicts - {"batched"}, f"no lucky and unlucky draw among {len(measured)}"
    assert checks.combine({n: e for n, (e, _) in measured.items()})["verdict"] == "prefill_alone"
    lucky = next(path for e, path in measured.values() if e["verdict"] == "batched")
    result = check(load_model(str(lucky)))
    assert not result["agrees"] and result["max_difference"] > 0.01
