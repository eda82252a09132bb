"""Real Jupyter server processes on loopback, for tests that drive the server from outside (SDKs,
kernels, a notebook shell connected with %mlx connect): `jupyter mlx` (headless), or `jupyter
server` with the extension enabled as `make lab` has it, over plain HTTP, TLS or a unix socket,
with a token, Jupyter's default auth or a password."""

import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import httpx

KEY_FILE = "mlx-nb-api-key"

# Server extensions the test servers leave out. jupyter-ai's litellm extension (installed with the
# test extra) takes 6-8 s of CPU to import on every server start, and no test uses it: its magics are
# tested through `jupyter mlx` in test_server_jupyter_ai.py.
LEFT_OUT = {"jupyter_ai_litellm": False}


def jupyter_config_dir(path: Path) -> Path:
    """A user-level Jupyter config folder (for JUPYTER_CONFIG_DIR) that disables LEFT_OUT, as
    `jupyter server extension disable --user` would; the venv's own config still applies."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {"jpserver_extensions": LEFT_OUT}}))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Live:
    """A server's addresses and credentials. `http` carries the mlx API key (the mlx routes),
    `jupyter` the Jupyter token (Jupyter's own routes), both over the server's transport."""

    def __init__(self, root: Path, token: Optional[str], sock: Optional[Path] = None, cert: Optional[Path] = None):
        self.root, self.sock, self.cert = root, sock, cert
        self.port = free_port()
        self.token = token  # None: Jupyter's default (read from the server's runtime file once it runs)
        self.base = "http://localhost" if sock else f"{'https' if cert else 'http'}://127.0.0.1:{self.port}"
        self.url = f"{self.base}/mlx/v1"
        self.runtime = root / "runtime"
        self.key = ""
        self.http = self.jupyter = None

    def client(self, **headers) -> httpx.Client:
        verify = ssl.create_default_context(cafile=str(self.cert)) if self.cert else True
        transport = dict(transport=httpx.HTTPTransport(uds=str(self.sock), verify=verify)) if self.sock else {}
        return httpx.Client(headers=headers, timeout=60, trust_env=False, verify=verify, **transport)

    def connect(self) -> None:
        """Once the server runs: read its key (and default token) and make the two clients."""
        self.key = (self.runtime / KEY_FILE).read_text().strip()
        if self.token is None:
            (info,) = self.runtime.glob("jpserver-*.json")
            self.token = json.loads(info.read_text())["token"]
        self.http = self.client(Authorization=f"Bearer {self.key}")
        self.jupyter = self.client(Authorization=f"token {self.token}") if self.token else self.client()

    def close(self) -> None:
        for c in (self.http, self.jupyter):
            if c is not None:
                c.close()

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
def serving(root: Path, model: str, *args: str, app: str = "mlx", token: Optional[str] = "generate",
            sock: bool = False, cert: Optional[Path] = None, key: Optional[Path] = None):
    """A `jupyter <app>` server serving `model`, its root, runtime and config under `root`.

    token: "generate" (a random one, passed as --IdentityProvider.token), None (Jupyter's default
    auth settings: it makes its own) or "" (none: pass a password in `args`). `sock`: listen on a
    unix socket instead of a port; `cert`/`key`: serve TLS."""
    token = secrets.token_hex(16) if token == "generate" else token
    server = Live(root, token, root / "jupyter.sock" if sock else None, cert)
    (root / "notebooks").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_NB_URL") and k != "MLX_NB_TOKEN"}
    env.update(JUPYTER_RUNTIME_DIR=str(server.runtime), JUPYTER_CONFIG_DIR=str(jupyter_config_dir(root / "config")))
    # jobs, files and fine-tunes in the server's own folder, not the user's data home (whose fine-tunes'
    # adapters a server would serve and list), unless the test names one
    env.setdefault("MLX_NB_JOBS_DIR", str(root / "data-home"))
    cmd = [
        str(Path(sys.executable).with_name("jupyter")),
        app,
        "--allow-root",
        "--ServerApp.open_browser=False",
        f"--ServerApp.root_dir={root / 'notebooks'}",
        f"--MLXExtension.model={model}",
        *([f"--ServerApp.sock={server.sock}"] if sock else
          ["--ip=127.0.0.1", f"--port={server.port}", "--ServerApp.port_retries=0"]),
        *([f"--ServerApp.certfile={cert}", f"--ServerApp.keyfile={key}"] if cert else []),
        *([f"--IdentityProvider.token={token}", "--ServerApp.allow_unauthenticated_access=False"]
          if token is not None else []),
        *args,
    ]
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    server.proc = proc
    try:
        deadline = time.monotonic() + 180  # a loaded 2-core CI machine can take a while to load a model
        with server.client() as probe:
            while True:
                assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "server not healthy in 180 s"
                try:  # health needs no token
                    if probe.get(f"{server.url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        server.connect()
        yield server
    finally:
        server.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
