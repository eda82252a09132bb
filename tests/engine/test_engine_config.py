"""One configuration: EngineConfig declares every engine setting once; Engine's keywords, the server's
`c.MLXExtension` traits and the settings rows the docs render are all derived from it."""

import dataclasses
import inspect

import pytest

from mlx_nb.engine import Engine, EngineConfig
from mlx_nb.engine.config import settings_rows

FIELDS = [f.name for f in dataclasses.fields(EngineConfig)]


def test_engine_takes_every_setting_by_name_and_nothing_else():
    params = inspect.signature(Engine).parameters
    assert [p for p in params if p not in ("model", "config", "wait")] == FIELDS
    for f in dataclasses.fields(EngineConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert params[f.name].default == default, f.name
    with pytest.raises(TypeError, match="no setting 'max_bach'.*max_batch"):
        Engine("tiny-llama", max_bach=4)


@pytest.mark.parametrize("settings,message", [
    ({"kv_bits": 3}, "kv_bits must be one of"), ({"kv_bits": 8, "kv_group_size": 48}, "group"),
    ({"job_rows_under_load": -1}, "job_rows_under_load"), ({"batch_policy": "fast"}, "batch_policy must be"),
    ({"max_batch": 0}, "max_batch must be a whole number"), ({"prefill_step_size": 1.5}, "prefill_step_size"),
])
def test_a_wrong_setting_is_refused_in_one_line_naming_it(settings, message):
    with pytest.raises(ValueError, match=message) as info:
        EngineConfig(**settings)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=message):  # before any thread or model load
        Engine("tiny-llama", **settings)


def test_a_config_and_settings_over_it():
    base = EngineConfig(max_batch=4, kv_bits=8)
    with Engine("tiny-llama", config=base, prefill_budget_s=None, wait=True) as eng:
        assert eng.config.max_batch == 4 and eng.config.kv_bits == 8 and eng.config.prefill_budget_s is None
        assert eng.status()["options"]["max_batch"] == 4
    assert base.prefill_budget_s == 0.25  # the config given is not changed


def test_the_server_traits_are_the_configs():
    from jupyter_ext.app import MLXExtension

    traits = MLXExtension.class_traits(config=True)
    for row in settings_rows():
        if not row["server"]:
            continue
        trait = traits[row["name"]]
        assert trait.default_value == row["default"], row["name"]
        assert trait.help == row["help"], row["name"]
    # the engine-only settings have the server's own counterpart (or are not a server's to set)
    own = {"draft_model": "draft_models", "image_roots": "image_roots", "prefix_cache_dir": "prefix_cache_dir"}
    for row in settings_rows():
        if not row["server"] and row["name"] in own:
            assert own[row["name"]] in traits
