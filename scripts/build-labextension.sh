#!/usr/bin/env bash
# Build the JupyterLab extension (labextension/: the status bar item and the MLX sidebar) into
# jupyter_ext/labextension and copy it where the venv's JupyterLab finds federated extensions
# (a copy, not a link: the venv keeps working if this checkout moves or goes).
# Needs node >= 18 and npm (the npm registry, once, for `npm ci`); without them the Lab runs
# without the MLX panels and this says so. Usage: scripts/build-labextension.sh VENV_BIN
set -euo pipefail
BIN=$(cd "${1:?usage: build-labextension.sh VENV_BIN}" && pwd)
HERE=$(cd "$(dirname "$0")/.." && pwd)
SRC=$HERE/labextension
OUT=$HERE/jupyter_ext/labextension
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "labextension: node/npm not found, so the Lab's MLX status bar and sidebar are not built (install node 18+)"
    exit 0
fi
cd "$SRC"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
    for attempt in 1 2 3; do  # the registry can drop a connection: try again before failing the build
        npm ci --no-audit --no-fund --silent && break
        [ "$attempt" = 3 ] && { echo "labextension: npm ci failed three times (is the npm registry reachable?)"; exit 1; }
        sleep $((attempt * 5))
    done
    touch node_modules
fi
CORE_PATH=$("$BIN/python" -c "import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), 'staging'))")
export CORE_PATH
npm run -s build >/dev/null
PREFIX=$("$BIN/python" -c "import sys; print(sys.prefix)")
DEST=$PREFIX/share/jupyter/labextensions/mlx-nb-labextension
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.new" && cp -r "$OUT" "$DEST.new" && rm -rf "$DEST" && mv "$DEST.new" "$DEST"
echo "labextension: built and installed in $DEST"
