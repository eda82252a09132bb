"""docs/settings.md, generated: every setting of the server (`c.MLXExtension.<name>` in a config file,
`--MLXExtension.<name>=...` on the command line), the engine's (EngineConfig's, exposed through
EngineTraits) and the server's own, with its type, default and help, read from the traits themselves.
So the page cannot miss one or drift from the code (tests/server/test_server_settings_doc.py).

    .venv/bin/python -m jupyter_ext.settings_doc    # rewrites docs/settings.md
"""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
OWNERS = ("MLXExtension", "EngineTraits")  # Jupyter's own application traits are documented by Jupyter


def _default(trait) -> str:
    value = trait.default_value
    if value is None or type(value).__name__ in ("Sentinel", "_Undefined") or repr(value) == "traitlets.Undefined":
        value = trait.make_dynamic_default() if hasattr(trait, "make_dynamic_default") else None
    text = repr(value) if value not in (None, "") else ("unset" if value is None else "''")
    return f"`{text}`" if len(text) < 40 else f"`{text[:37]}...`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render() -> str:
    from jupyter_ext.app import MLXExtension

    traits = {n: t for n, t in MLXExtension.class_traits(config=True).items() if t.this_class.__name__ in OWNERS}
    lines = ["# Settings", "",
             "Every setting of the server, generated from the code (`python -m jupyter_ext.settings_doc`). Set one "
             "as `jupyter lab --MLXExtension.<name>=...` (or `jupyter mlx --MLXExtension.<name>=...`), or as "
             "`c.MLXExtension.<name> = ...` in a Jupyter config file. The engine's settings are also "
             "`Engine(model, <name>=...)` keywords (`mlx_nb.engine.EngineConfig`).", "",
             "| setting | type | default | what it does |", "|---|---|---|---|"]
    for name in sorted(traits):
        t = traits[name]
        lines.append(f"| `{name}` | {type(t).__name__} | {_default(t)} | {_cell(t.help or '')} |")
    from mlx_nb.environment import markdown

    lines += ["", "## Environment variables", "", "Read by the package itself (the server, kernels and notebooks "
              "alike); the list is checked against every `MLX_NB_*` name the code reads.", "", *markdown()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}")
