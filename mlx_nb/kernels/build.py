"""Build the native kernels in place: `python -m mlx_nb.kernels.build [--force] [--require]`.

Configures `csrc/` with CMake (the PyPI `cmake` in this environment; Ninja when present) against
the installed mlx wheel and nanobind, and puts `_native*.so` beside this file with a stamp of what
it was built from, so a re-run with nothing changed returns at once. Without a compiler it says so
and exits 0 (the project then runs on MLX's own ops) unless --require is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SRC = HERE / "csrc"
BUILD = HERE / "_build"
STAMP = HERE / "_native.json"


def _fingerprint() -> dict:
    import mlx.core as mx
    import nanobind

    digest = hashlib.sha256()
    for path in sorted(SRC.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"sources": digest.hexdigest(), "mlx": mx.__version__, "nanobind": nanobind.__version__,
            "python": sysconfig.get_config_var("EXT_SUFFIX")}


def _tool(name: str) -> str | None:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _built() -> Path | None:
    found = sorted(HERE.glob("_native*.so")) + sorted(HERE.glob("_native*.pyd"))
    return found[0] if found else None


def build(force: bool = False, quiet: bool = False) -> tuple[bool, str]:
    """(ok, message). Rebuilds only when the sources, mlx, nanobind or Python changed."""
    try:
        want = _fingerprint()
    except ImportError as exc:
        return False, f"cannot build the kernels: {exc} (install the project's dependencies first)"
    try:
        have = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        have = {}
    if not force and _built() and {k: have.get(k) for k in want} == want:
        return True, "kernels up to date"
    cmake, cxx = _tool("cmake"), _compiler()
    if not cmake or not cxx:
        missing = "cmake" if not cmake else "a C++ compiler (g++ or clang++)"
        return False, f"kernels not built: {missing} not found; mlx-nb runs on MLX's own CPU ops"
    configure = [cmake, "-S", str(SRC), "-B", str(BUILD), f"-DPython_EXECUTABLE={sys.executable}",
                 "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CXX_COMPILER={cxx}"]
    ninja = _tool("ninja")
    if ninja and not (BUILD / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    jobs = str(os.cpu_count() or 1)
    for cmd in (configure, [cmake, "--build", str(BUILD), "--parallel", jobs]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            return False, f"kernels build failed ({' '.join(cmd[:2])} ...):\n{tail}"
        if not quiet:
            print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "", file=sys.stderr)
    built = sorted(BUILD.glob("_native*.so")) + sorted(BUILD.glob("_native*.pyd"))
    if not built:
        return False, "kernels build produced no module"
    for old in HERE.glob("_native*.so"):
        old.unlink()
    # Replace atomically: a running process keeps the old file's inode.
    fd, tmp = tempfile.mkstemp(dir=HERE, prefix=".native-")
    os.close(fd)
    shutil.copyfile(built[0], tmp)
    os.replace(tmp, HERE / built[0].name)
    stamp = dict(want, compiler=subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0])
    fd, tmp = tempfile.mkstemp(dir=HERE, prefix=".stamp-")
    with os.fdopen(fd, "w") as f:
        json.dump(stamp, f, indent=2)
    os.replace(tmp, STAMP)
    return True, f"kernels built: {built[0].name}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--require", action="store_true", help="exit 1 if the kernels cannot be built")
    args = parser.parse_args(argv)
    ok, message = build(force=args.force)
    print(f"mlx-nb: {message}", file=sys.stderr)
    return 0 if ok or not args.require else 1


if __name__ == "__main__":
    sys.exit(main())
