"""mlx_nb/models never imports mlx_nb.engine: the engine depends on models, not the reverse
(DESIGN.md). Read from the source, so an import inside a function counts too."""

import ast
from pathlib import Path

import mlx_nb.models

MODELS = Path(mlx_nb.models.__file__).parent


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, relative ones resolved in `package`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = node.module or "" if node.level == 0 else ".".join(
                [*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            found += [(node.lineno, base), *((node.lineno, f"{base}.{a.name}") for a in node.names)]
    return found


def engine_imports(path: Path, package: str) -> list[str]:
    return [f"{path.name}:{line} {name}" for line, name in sorted(imported_modules(path, package))
            if name == "mlx_nb.engine" or name.startswith("mlx_nb.engine.")]


def test_models_package_does_not_import_the_engine():
    offenders = []
    for path in sorted(MODELS.rglob("*.py")):
        package = ".".join(path.relative_to(MODELS.parent.parent).parent.parts)
        offenders += engine_imports(path, package)
    assert not offenders, f"mlx_nb/models imports mlx_nb.engine: {offenders}"


def test_the_check_sees_every_import_form(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import mlx_nb.engine.caches.layout\ndef f():\n    from mlx_nb.engine.inputs.vision import x\n"
                   "from ..engine import y\nfrom .. import engine\nfrom mlx_nb.models import z\nfrom . import atomic\n")
    hits = engine_imports(bad, "mlx_nb.models")
    assert [h.split(":")[1] for h in hits] == ["1 mlx_nb.engine.caches.layout", "3 mlx_nb.engine.inputs.vision", "3 mlx_nb.engine.inputs.vision.x",
                                              "4 mlx_nb.engine", "4 mlx_nb.engine.y", "5 mlx_nb.engine"]


def test_magics_and_widgets_reach_the_engine_only_through_the_client():
    offenders = []
    for folder in ("magics", "widgets"):
        root = MODELS.parent / folder
        for path in sorted(root.rglob("*.py")):
            offenders += engine_imports(path, f"mlx_nb.{folder}")
    assert not offenders, f"magics/widgets import mlx_nb.engine: {offenders}"


def test_loader_and_vision_do_not_import_each_other():
    """The loader loads vision models through vision.py; vision.py takes what both make from loaded.py."""
    vision = {m for _, m in imported_modules(MODELS / "vision.py", "mlx_nb.models")}
    assert not any(m == "mlx_nb.models.loader" or m.startswith("mlx_nb.models.loader.") for m in vision)


def test_the_engine_reaches_the_kernels_only_through_their_face():
    """mlx_nb/engine calls mlx_nb.kernels.ops, which picks native or MLX inside: no engine module
    imports the kernels package itself (and so never asks kernels.available())."""
    engine = MODELS.parent / "engine"
    offenders = []
    for path in sorted(engine.rglob("*.py")):
        for line, name in imported_modules(path, "mlx_nb.engine"):
            if name.startswith("mlx_nb.kernels") and name not in ("mlx_nb.kernels.ops", "mlx_nb.kernels"):
                offenders.append(f"{path.name}:{line} {name}")
            elif name == "mlx_nb.kernels" and not any(n == "mlx_nb.kernels.ops" for ln, n in
                                                      imported_modules(path, "mlx_nb.engine") if ln == line):
                offenders.append(f"{path.name}:{line} {name}")
    assert not offenders, f"the engine reaches into mlx_nb.kernels: {offenders}"


def test_the_server_draws_pictures_without_ipywidgets():
    """The SVG pictures are their own floor (mlx_nb.pictures): the server's routes draw with them,
    and neither imports ipywidgets (nor the engine)."""
    import subprocess
    import sys

    alone = ("import sys\nfrom mlx_nb.pictures.batch import build_batch_svg\nbuild_batch_svg([])\n"
             "from mlx_nb.pictures import CachePicture\n"
             "assert not [m for m in sys.modules if m.startswith(('mlx_nb.engine', 'ipywidgets'))], 'imported'\n")
    server = ("import sys, jupyter_ext.monitor, jupyter_ext.app\n"
              "assert 'ipywidgets' not in sys.modules, 'the server imported ipywidgets'\n")
    for code in (alone, server):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
    pictures = MODELS.parent / "pictures"
    for path in sorted(pictures.rglob("*.py")):
        names = [n for _, n in imported_modules(path, "mlx_nb.pictures")]
        assert not [n for n in names if n.startswith(("ipywidgets", "mlx_nb.widgets", "mlx_nb.engine"))], path.name


def test_the_engine_reads_no_wire_format():
    """The routes, the Client and the magics turn their wire formats into the engine's typed
    SubmitRequest (a Constraint, not a response_format): no engine module imports mlx_nb.api."""
    engine = MODELS.parent / "engine"
    offenders = [f"{path.name}:{line} {name}" for path in sorted(engine.rglob("*.py"))
                 for line, name in imported_modules(path, "mlx_nb.engine")
                 if name == "mlx_nb.api" or name.startswith("mlx_nb.api.")]
    assert not offenders, f"the engine imports the wire formats: {offenders}"
