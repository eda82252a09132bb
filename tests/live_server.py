"""A real `jupyter mlx` process on loopback, for tests that drive the server from outside
(SDKs, kernels, a notebook shell connected with %mlx connect)."""

import os
import secrets
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Live:
    def __init__(self, root: Path):
        self.port, self.token, self.root = free_port(), secrets.token_hex(16), root
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/mlx/v1"
        self.runtime = root / "runtime"
        self.http = httpx.Client(headers={"Authorization": f"token {self.token}"}, timeout=60, trust_env=False)

    def get(self, path: str, **params):
        r = self.http.get(f"{self.url}/{path}", params=params)
        r.raise_for_status()
        return r.json()

    def last_seq(self) -> int:
        events = self.get("events", stream=0)
        return events[-1]["seq"] if events else 0

    def events(self, since: int) -> list[dict]:
        return self.get("events", stream=0, since=since)

    def wait_event(self, since: int, match, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events(since) if match(e)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError("no matching batch event")


@contextmanager
def serving(root: Path, model: str, *options: str):
    """A `jupyter mlx` server serving `model`, with its root, runtime and config under `root`;
    `options` are more command-line flags (`--MLXExtension.backend_url=...`)."""
    server = Live(root)
    (root / "notebooks").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_NB_URL") and k != "MLX_NB_TOKEN"}
    env.update(JUPYTER_RUNTIME_DIR=str(server.runtime), JUPYTER_CONFIG_DIR=str(root / "config"))
    cmd = [
        str(Path(sys.executable).with_name("jupyter")),
        "mlx",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={server.port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={server.token}",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_unauthenticated_access=False",
        f"--ServerApp.root_dir={root / 'notebooks'}",
        f"--MLXExtension.model={model}",
        *options,
    ]
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "server not healthy in 60 s"
            try:  # health needs no token
                if httpx.get(f"{server.url}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield server
    finally:
        server.http.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
