"""The coding agents' CLIs, installed unmodified from npm into a cache the first time a test asks.

Pinned versions (bump them here): what the agents' tests were last run with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

PACKAGES = {
    "claude": "@anthropic-ai/claude-code@2.1.197",
    "codex": "@openai/codex@0.169.0",
    "opencode": "opencode-ai@1.18.33",
}


def cache_dir() -> Path:
    given = os.environ.get("MLX_NB_AGENTS_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlx-nb" / "agents"


def binary(agent: str) -> tuple[Optional[Path], str]:
    """(path to the agent's CLI, "") once installed, else (None, why not)."""
    where = cache_dir()
    exe = where / "node_modules" / ".bin" / agent
    if exe.exists():
        return exe, ""
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not installed: install node and npm to run the coding agents' tests"
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", "--loglevel=error",
                               *PACKAGES.values()], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "npm install of the agents' CLIs took over 15 minutes"
    if done.returncode != 0 or not exe.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return None, f"npm could not install {PACKAGES[agent]} (is the npm registry reachable?): {' / '.join(tail)}"
    return exe, ""


if __name__ == "__main__":  # `make test` installs them while pip runs, instead of in the first agent's test
    for name in PACKAGES:
        exe, why = binary(name)
        print(f"agents: {name} {'ready' if exe else 'not installed: ' + why}")
