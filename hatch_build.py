"""Wheel build hook: the Lab extension ships inside the wheel, where JupyterLab finds it.

`make` builds it (scripts/build-labextension.sh, node and JupyterLab's own builder) into
jupyter_ext/labextension; a wheel built after that carries it as
share/jupyter/labextensions/mlx-nb-labextension, so installing the wheel enables it (JupyterLab reads
that folder of its environment). Built JavaScript is not committed, so a wheel built from a checkout
that has not been through make has no Lab panels, and the build says so. Editable installs (make's)
get a copy from the build script instead.
"""

from __future__ import annotations

from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NAME = "mlx-nb-labextension"


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        built = Path(self.root) / "jupyter_ext" / "labextension"
        if not (built / "package.json").exists():
            self.app.display_warning(
                f"{NAME} is not built, so this wheel has no Lab panels: run `make` (needs node 18+) first")
            return
        for path in sorted(built.rglob("*")):
            if path.is_file():
                target = f"share/jupyter/labextensions/{NAME}/{path.relative_to(built).as_posix()}"
                build_data["shared_data"][str(path)] = target
