"""The engine's rooms and face: code outside `mlx_nb/engine/` imports the engine only through its
face (`mlx_nb.engine`), the face loads nothing until a name is used, and the light layers (the API,
the client, the widgets, jobs, magics) import without MLX — checked in a fresh process, where
`sys.modules` tells the truth (a test process has MLX loaded already)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mlx_nb
import mlx_nb.engine

ROOT = Path(mlx_nb.__file__).parent.parent
ENGINE = ROOT / "mlx_nb" / "engine"


def engine_imports(path: Path) -> list[str]:
    """The engine modules a file imports (`mlx_nb.engine...` as written)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlx_nb.engine"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("mlx_nb.engine")]
    return found


def outside_code() -> list[Path]:
    files = [*ROOT.joinpath("mlx_nb").rglob("*.py"), *ROOT.joinpath("jupyter_ext").rglob("*.py")]
    return [f for f in files if ENGINE not in f.parents]


def test_code_outside_the_engine_imports_only_its_face():
    files = outside_code()
    assert len(files) > 50
    deep = {f"{f.relative_to(ROOT)}: {m}" for f in files for m in engine_imports(f) if m != "mlx_nb.engine"}
    assert not deep, sorted(deep)


def test_every_name_the_face_lists_is_there():
    for name in mlx_nb.engine.__all__:
        assert getattr(mlx_nb.engine, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        mlx_nb.engine.nothing_here  # noqa: B018 -- the look-up is the test


def test_every_module_sits_in_a_room():
    loose = sorted(p.name for p in ENGINE.glob("*.py"))
    assert loose == ["__init__.py", "adapter_controls.py", "config.py", "engine.py", "events.py", "handle.py",
                     "prefix_controls.py", "submit_request.py", "types.py"]
    for room in ("scheduling", "batch", "caches", "speculation", "inputs", "text", "sampling", "embedding"):
        init = ENGINE / room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{room}/ says what it holds"


LIGHT = ["mlx_nb.engine", "mlx_nb.api", "mlx_nb.api.routes", "mlx_nb.client", "mlx_nb.widgets", "mlx_nb.jobs",
         "mlx_nb.magics", "mlx_nb.registry"]


@pytest.mark.parametrize("module", LIGHT)
def test_the_light_layers_import_without_mlx(module):
    probe = (f"import json, sys, {module}; "
             "from mlx_nb.engine import RequestError, SubmitRequest, Constraint, Delta; "
             "print(json.dumps(sorted(m for m in ('mlx.core', 'mlx_lm', 'mlx_vlm') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"importing {module} loaded MLX"
