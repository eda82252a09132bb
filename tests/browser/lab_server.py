"""A real `jupyter lab` process and headless chromium, shared by the browser tests.

`Lab(root, cells, model)` serves a notebook of those cells with the extension on loopback (its own
token, settings and workspaces); the `page` fixture is Debian's chromium driven by Playwright
(Playwright's own browser download needs the network). Screenshots land in test-output/browser/,
which git ignores.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from live_server import jupyter_config_dir

CHROMIUM = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else shutil.which("chromium")
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"
NOTEBOOK = "browser_e2e.ipynb"
WAIT_S = 120  # each wait: model load / kernel start on 2 shared CPUs
MS = 1000

# Quiet JupyterLab: no "receive Jupyter news?" toast, no update check.
SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
    "fetchNews": "false", "checkForUpdates": False}}


def _requirements() -> None:
    if not CHROMIUM:
        pytest.skip("chromium not installed: apt-get install chromium (make test installs it as root)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed: pip install -e '.[test]'")


def extension_installed() -> None:
    """Skip (saying why) where node is missing, so make could not build the extension; else it must
    be installed and enabled."""
    _requirements()
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("NOT RUN: node/npm are not installed, so make did not build the Lab extension")
    line = _listed_line()
    assert "enabled" in line and "OK" in line, "the Lab extension is not installed: run make lab"


@functools.cache
def _listed_line() -> str:
    """The extension's line in `jupyter labextension list`: asked once a test process (the command
    takes ~5 s of CPU, and nothing installs or removes the extension while the tests run)."""
    listed = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True)
    return next((x for x in (listed.stdout + listed.stderr).splitlines() if "mlx-nb-labextension" in x), "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, str(path))


class Lab:
    """A `jupyter lab` subprocess on loopback with its own token, root, settings and workspaces."""

    def __init__(self, root: Path, cells: list[str], model: str = "smollm2-135m-instruct", files: tuple = (),
                 args: tuple = ()):
        """`cells`: the notebook's code cells; `files`: more files copied next to it; `args`: more server flags."""
        self.root, self.cells, self.model, self.files, self.args = root, cells, model, files, args
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "lab.log"
        self.proc: subprocess.Popen | None = None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def start(self) -> None:
        notebooks = self.root / "notebooks"
        notebooks.mkdir()
        _write_notebook(notebooks / NOTEBOOK, self.cells)
        for f in self.files:
            shutil.copy(f, notebooks / Path(f).name)
        settings = self.root / "lab-settings"
        for rel, values in SETTINGS.items():
            (settings / rel).parent.mkdir(parents=True, exist_ok=True)
            (settings / rel).write_text(json.dumps(values))
        # The server publishes its own URL and token to its kernels: drop any inherited ones.
        env = {k: v for k, v in os.environ.items() if k not in ("MLX_NB_URL", "MLX_NB_TOKEN", "MLX_NB_NO_STREAM")}
        env.update(
            JUPYTER_RUNTIME_DIR=str(self.root / "runtime"),
            JUPYTER_CONFIG_DIR=str(jupyter_config_dir(self.root / "config")),  # the venv's etc/jupyter stays
            JUPYTERLAB_SETTINGS_DIR=str(settings),
            JUPYTERLAB_WORKSPACES_DIR=str(self.root / "workspaces"),
            PYTHONUNBUFFERED="1",
        )
        cmd = [
            sys.executable, "-m", "jupyter", "lab",
            "--no-browser",
            "--allow-root",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={notebooks}",
            f"--LabApp.workspaces_dir={self.root / 'workspaces'}",
            f"--LabApp.user_settings_dir={settings}",
            f"--MLXExtension.model={self.model}",
            *self.args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)

    def wait_ready(self) -> None:
        """Until the engine's health says `ok` and `/lab` serves its page."""
        deadline = time.monotonic() + WAIT_S
        health = lab_ok = None
        with httpx.Client(timeout=5, trust_env=False) as http:
            while True:
                assert self.proc.poll() is None, f"jupyter lab exited ({self.proc.returncode}):\n{self.log_tail()}"
                assert time.monotonic() < deadline, (
                    f"not ready in {WAIT_S} s (health {health}, /lab {lab_ok}):\n{self.log_tail()}")
                try:
                    r = http.get(f"{self.base}/mlx/v1/health")  # no token needed
                    health = (r.status_code, r.json().get("status"))
                    assert health[1] != "error", f"the model failed to load:\n{self.log_tail()}"
                    if health == (200, "ok"):
                        lab_ok = http.get(f"{self.base}/lab", params={"token": self.token}).status_code
                        if lab_ok == 200:
                            return
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.25)

    def __enter__(self) -> "Lab":
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: the server shuts its kernels down
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def page():
    _requirements()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"],
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000},
                                          permissions=["clipboard-read", "clipboard-write"])
            page = context.new_page()
            # a modal that JupyterLab opens while the test acts is accepted before the action goes on
            page.add_locator_handler(page.locator(".jp-Dialog").first, _accept_dialog)
            yield page
        finally:
            browser.close()


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _accept_dialog(dialog) -> None:
    """Accept a modal JupyterLab put up, printing what it said (Escape when it has no accept button).
    The extension opens none; Lab opens its own (a kernel selector, a notice about its connection),
    and one that opens between two steps swallows every click after it (seen once, under a full test
    run's load). What comes next still checks that the page works."""
    text = " | ".join(dialog.inner_text().split("\n"))
    print(f"JupyterLab showed a dialog, accepted: {text[:300]}")
    accept = dialog.locator(".jp-Dialog-button.jp-mod-accept")
    if accept.count():
        accept.first.click()
    else:
        dialog.page.keyboard.press("Escape")


def _dismiss_dialogs(page) -> None:
    """A dialog already open (the `page` fixture's handler deals with one that opens later)."""
    dialog = page.locator(".jp-Dialog").first
    if dialog.count():
        _accept_dialog(dialog)


def open_notebook(lab: Lab, page):
    """Open the lab's notebook; returns (notebook, its idle indicator) once the kernel is idle."""
    from playwright.sync_api import expect

    page.goto(f"{lab.base}/lab/tree/{NOTEBOOK}?token={lab.token}", wait_until="domcontentloaded",
              timeout=60 * MS)
    notebook = page.locator(".jp-NotebookPanel").first
    expect(notebook.locator(".jp-Cell")).to_have_count(len(lab.cells), timeout=60 * MS)
    _dismiss_dialogs(page)
    idle = notebook.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    expect(idle).to_have_count(1, timeout=WAIT_S * MS)  # the kernel has started and is idle
    return notebook, idle


def menu(page, *path: str) -> None:
    """Click through the menu bar: `menu(page, "Settings", "Theme", "JupyterLab Dark")`."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{path[0]}$")).click()
    for label in path[1:]:
        page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel", has_text=re.compile(f"^{label}$")).click()


def run_all_cells(page, notebook) -> None:
    """Run > Run All Cells, as a user would. A click that lands before the notebook is ready to
    execute (the menu works, nothing runs) is retried, as a user would, until the first cell starts."""
    from playwright.sync_api import expect

    prompt = notebook.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt")
    for attempt in range(3):
        menu(page, "Run", "Run All Cells")
        try:
            expect(prompt).not_to_have_text(re.compile(r"^\[ \]:$"), timeout=10 * MS)
            return
        except AssertionError:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")


@contextmanager
def watched(page, lab: Lab, failure_shot: str = "99-failure"):
    """Yields the page's script errors as they come; on a failure, a screenshot and the server log."""
    from playwright.sync_api import Error as PlaywrightError

    page.set_default_timeout(30 * MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield errors
    except Exception:
        try:
            _shot(page, failure_shot)
        except PlaywrightError as exc:
            print(f"no failure screenshot: {exc}")
        print(f"page errors: {errors}\n--- lab.log ---\n{lab.log_tail()}")
        raise
