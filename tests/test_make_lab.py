"""`make lab` in a fresh clone reaches a running JupyterLab (as root too), with ARGS passed through,
and builds the Lab extension (node and the npm registry) that `jupyter labextension list` then shows.

The clone is of this repository's committed HEAD. Its `.venv` is a link to the virtualenv running
the tests (building a fresh one means downloading MLX and JupyterLab: minutes, and network), and
make is told the venv, the optional system packages and the CPU kernels are up to date (`-o
.venv/.installed -o system-deps -o kernels`: a test installs and compiles nothing; the clone then runs
on MLX's own ops, which says it works without a compiler too); everything else is the clone's own Makefile and code
(PYTHONPATH points at the clone). The Lab extension's npm packages are this checkout's when its lock
file is the clone's (`npm ci` would install the same files; the `make test` that runs this test has
already run it here), so the clone's build compiles and bundles without downloading.
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from live_server import free_port, jupyter_config_dir

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 120


@pytest.fixture
def clone(tmp_path):
    if shutil.which("make") is None or shutil.which("git") is None:
        pytest.skip("make and git are needed: apt-get install make git")
    dest = tmp_path / "mlx-nb"
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    (dest / ".venv").symlink_to(sys.prefix)  # the virtualenv running this test
    ours, theirs = REPO / "labextension", dest / "labextension"
    if (ours / "node_modules").is_dir() and (ours / "package-lock.json").read_bytes() == \
            (theirs / "package-lock.json").read_bytes():
        (theirs / "node_modules").symlink_to(ours / "node_modules")
        os.utime(theirs / "package-lock.json", (0, 0))  # older than the packages: the build skips `npm ci`
    return dest


def test_make_lab_starts_jupyterlab_and_passes_args(clone, tmp_path):
    port, token = free_port(), secrets.token_hex(8)
    args = (f"--port={port} --ServerApp.port_retries=0 --ServerApp.ip=127.0.0.1 --no-browser "
            f"--IdentityProvider.token={token} --MLXExtension.model=tiny-llama")
    env = {k: v for k, v in os.environ.items() if k not in ("MLX_NB_URL", "MLX_NB_TOKEN")}
    env.update(PYTHONPATH=str(clone), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(jupyter_config_dir(tmp_path / "config")),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    log = tmp_path / "make.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["make", "-o", ".venv/.installed", "-o", "system-deps", "-o", "kernels", "lab",
                                 f"ARGS={args}"], cwd=clone, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, answered = time.monotonic() + WAIT_S, None
        while answered is None:
            assert proc.poll() is None, f"make lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no JupyterLab on port {port}:\n{log.read_text()[-3000:]}"
            try:
                lab = httpx.get(f"{base}/lab", params={"token": token}, timeout=5, trust_env=False)
                status = httpx.get(f"{base}/api/status", headers={"Authorization": f"token {token}"}, timeout=5,
                                   trust_env=False)
                if lab.status_code == 200 and status.status_code == 200:
                    answered = lab.text
            except httpx.HTTPError:
                time.sleep(0.5)
        assert "JupyterLab" in answered  # the lab page, on the port given through ARGS
        output = log.read_text()
        as_root = os.geteuid() == 0
        command = next(line for line in output.splitlines() if "bin/jupyter lab" in line)  # as make echoed it
        assert f"--port={port}" in command and ("--allow-root" in command) == as_root
        assert ("make lab: running as root, so adding --allow-root" in output) == as_root
        # the Lab extension (status bar, MLX sidebar) was built from the clone and is enabled
        if shutil.which("node") is None or shutil.which("npm") is None:  # make says why it is not built
            assert "labextension: node/npm not found" in output, output[-3000:]
            return
        assert "labextension: built and installed" in output, output[-3000:]
        listed = subprocess.run([str(clone / ".venv" / "bin" / "jupyter"), "labextension", "list"], env=env,
                                capture_output=True, text=True)
        line = next(x for x in (listed.stdout + listed.stderr).splitlines() if "mlx-nb-labextension" in x)
        assert "enabled" in line and "OK" in line, line
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to make and the jupyter lab it started (their own process group), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
