"""The private parts of mlx_lm the engine builds on (mlx_nb/engine/batch/upstream_guard.py) are what is
installed, the pins that keep them so are exact, and the guard fails loudly when one changes."""

import re
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from mlx_nb.engine.batch import upstream_guard
from mlx_nb.engine.batch.upstream_guard import (
    INSTANCE_ATTRIBUTES,
    PRIVATE_API,
    VLM_INSTANCE_ATTRIBUTES,
    Private,
    UpstreamChanged,
    check,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_private_name_we_use_is_as_we_use_it():
    assert check() == []


def test_the_guard_names_a_changed_signature_and_a_missing_method():
    class GenerationBatch:  # an mlx_lm whose decode step grew a parameter and whose split went away
        def _step(self, extra):
            pass

    fake = SimpleNamespace(GenerationBatch=GenerationBatch)

    def resolve(where):
        obj = fake
        for part in where.partition(":")[2].split("."):
            obj = getattr(obj, part)
        return obj

    table = (Private("mlx_lm.generate:GenerationBatch._step", ("self",), "the decode step"),
             Private("mlx_lm.generate:GenerationBatch.split", ("self", "indices"), "the cache hand-over"))
    problems = check(table, resolve)
    assert len(problems) == 2
    assert "GenerationBatch._step takes ('self', 'extra'), not ('self',)" in problems[0]
    assert "GenerationBatch.split is gone" in problems[1] and "the cache hand-over" in problems[1]


def test_an_engine_on_a_changed_mlx_lm_refuses_with_what_to_do(monkeypatch):
    broken = PRIVATE_API + (Private("mlx_lm.generate:GenerationBatch._step_v2", ("self",), "a future step"),)
    monkeypatch.setattr(upstream_guard, "PRIVATE_API", broken)
    monkeypatch.setattr(upstream_guard.check, "__defaults__", (broken, upstream_guard._resolve))
    with pytest.raises(UpstreamChanged) as info:
        upstream_guard.require()
    message = str(info.value)
    assert "\n" not in message and "_step_v2 is gone" in message
    assert f"pip install mlx-lm=={upstream_guard.TESTED['mlx-lm']}" in message


def test_instance_attributes_we_read_exist_on_real_batches():
    from mlx_nb.engine.batch.decode import Generator
    from mlx_nb.models import load_model

    loaded = load_model("tiny-llama")
    gen = Generator(loaded.model, completion_batch_size=4, prefill_batch_size=4, prefill_step_size=4)
    gen.insert_segments(segments=[[[1, 2, 3, 4, 5, 6]]], max_tokens=[4])
    seen = {}
    for _ in range(6):  # a step reads the prompt, later steps decode
        seen["PromptProcessingBatch"] = gen._prompt_batch if len(gen._prompt_batch) else seen.get("PromptProcessingBatch")
        gen.next()
    seen["GenerationBatch"] = gen._generation_batch
    seen["BatchGenerator"] = gen
    seen["BatchKVCache"] = next(c for c in gen._generation_batch.prompt_cache if type(c).__name__ == "BatchKVCache")
    seen["KVCache"] = next(c for c in loaded.make_cache() if type(c).__name__ == "KVCache")
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

    tok = loaded.tokenizer._tokenizer
    for detok in (BPEStreamingDetokenizer(tok), SPMStreamingDetokenizer(tok)):
        detok.add_token(5)  # the text attribute appears with the first token
        seen[type(detok).__name__] = detok
    for cls, names in INSTANCE_ATTRIBUTES.items():
        missing = [n for n in names if not hasattr(seen[cls], n)]
        assert not missing, f"mlx_lm's {cls} no longer has {missing}: pin mlx-lm or adapt mlx_nb/engine/batch/decode.py"
    gen.close()


@pytest.mark.parametrize("family", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
def test_the_mrope_state_we_read_exists_on_mlx_vlms_language_models(family):
    from mlx_nb.models import load_model

    lm = load_model(family).model.language_model
    for cls, names in VLM_INSTANCE_ATTRIBUTES.items():
        assert type(lm).__name__ == cls
        missing = [n for n in names if not hasattr(lm, n)]
        assert not missing, f"mlx_vlm's {family} {cls} no longer has {missing}: pin mlx-vlm or adapt mlx_nb/models/vision.py"


def test_the_libraries_the_engine_reaches_into_are_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([0-9][^;\s]*)", dep)
        if m:
            pins[m.group(1).lower()] = m.group(3)
    for name in ("mlx", "mlx-lm", "mlx-vlm"):
        assert name in pins, f"{name} is not pinned with == in pyproject.toml"
        assert version(name) == pins[name], f"{name} {version(name)} is installed, {pins[name]} is pinned"
    assert pins["mlx-lm"] == upstream_guard.TESTED["mlx-lm"] and pins["mlx-vlm"] == upstream_guard.TESTED["mlx-vlm"]
