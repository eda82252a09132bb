"""docs/settings.md is generated from the server's traits, so it lists every setting the server takes
(the engine's and its own) with the help the code gives, and cannot drift from them."""

import dataclasses

from jupyter_ext import settings_doc
from jupyter_ext.app import MLXExtension
from mlx_nb.engine.config import EngineConfig


def test_the_page_is_what_the_generator_writes():
    assert settings_doc.DOC.read_text() == settings_doc.render(), "regenerate it: python -m jupyter_ext.settings_doc"


def test_every_setting_of_the_server_and_of_the_engine_it_exposes_is_listed():
    text = settings_doc.render()
    own = [n for n, t in MLXExtension.class_traits(config=True).items()
           if t.this_class.__name__ in settings_doc.OWNERS]
    engine = [f.name for f in dataclasses.fields(EngineConfig) if f.metadata["server"]]
    assert engine and set(engine) <= set(own)
    for name in own:
        assert f"| `{name}` |" in text
    for name in ("draft_models", "metrics_unauthenticated", "quantize", "jobs_dir", "max_batch"):
        assert f"| `{name}` |" in text, name
    assert "| `answer_yes` |" not in text  # Jupyter's own application settings are Jupyter's to document


def test_help_all_lists_each_engine_setting_once_under_the_server():
    import subprocess
    import sys
    from pathlib import Path

    jupyter = str(Path(sys.executable).with_name("jupyter"))
    text = subprocess.run([jupyter, "mlx", "--help-all"], capture_output=True, text=True, timeout=120).stdout
    assert text.count("--MLXExtension.max_batch=") == 1 and "--EngineTraits." not in text


def test_every_environment_variable_the_code_reads_is_documented():
    import re
    from pathlib import Path

    from mlx_nb.environment import VARIABLES

    root = Path(__file__).parents[2]
    sources = [*root.glob("mlx_nb/**/*.py"), *root.glob("jupyter_ext/**/*.py"), *root.glob("mlx_nb/kernels/csrc/*")]
    sources = [f for f in sources if f.is_file() and f.name != "environment.py"]  # the list itself reads nothing
    read = {m for f in sources for m in re.findall(r"MLX_NB_[A-Z_]+", f.read_text(errors="ignore"))}
    assert read - set(VARIABLES) == set(), "document them in mlx_nb/environment.py"
    assert set(VARIABLES) - read == set(), "no longer read: remove them from mlx_nb/environment.py"
