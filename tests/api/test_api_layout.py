"""The wire layer's modules import each other in one direction only (type-checking imports included),
and stay free of HTTP frameworks and MLX."""

import ast
from pathlib import Path

import mlx_nb.api

API = Path(mlx_nb.api.__file__).parent


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_no_import_circles_and_no_framework():
    graph = {}
    for path in API.glob("*.py"):
        if path.name == "__init__.py":
            continue
        deps = imports_of(path)
        assert not {d for d in deps if d.split(".")[0] in ("tornado", "jupyter_server", "mlx", "mlx_lm")}, path
        graph[path.stem] = {d.rsplit(".", 1)[-1] for d in deps if d.startswith("mlx_nb.api.")}
    assert len(graph) >= 10

    def visit(node, trail):
        assert node not in trail, " -> ".join([*trail, node])
        for dep in graph.get(node, ()):
            visit(dep, [*trail, node])

    for node in graph:
        visit(node, [])
