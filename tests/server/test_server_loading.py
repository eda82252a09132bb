"""A chat sent while the server's model loads waits, showing the load's progress, and completes.

The in-process server's load is held at its "loading weights" phase (the weights' load waits on a
gate), so the loading window is certain; the Client and `%%mlx chat` see 503 + Retry-After and
the status route's progress until the gate opens.
"""

import asyncio
import json
import threading
import time

import pytest
from IPython.utils.capture import capture_output

from jupyter_ext.kernel_env import direct_url
from mlx_nb.client import Client


@pytest.fixture
def weights_gate(monkeypatch):
    """Holds every model load in its "loading weights" phase until `.set()`."""
    import mlx_nb.models.loader as loader

    gate, real = threading.Event(), loader._load_text
    monkeypatch.setattr(loader, "_load_text", lambda *a, **k: gate.wait(60) and real(*a, **k))
    yield gate
    gate.set()


async def until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_status_reports_the_load_phase(weights_gate, jp_fetch, mlx_ext):
    assert await until(lambda: mlx_ext.engine.load_progress.phase == "loading weights")
    status = json.loads((await jp_fetch("mlx", "v1", "status")).body)
    assert status["loading"] and status["load"]["phase"] == "loading weights" and status["load"]["elapsed_s"] >= 0
    weights_gate.set()
    await asyncio.to_thread(mlx_ext.engine.wait_ready, 60)
    status = json.loads((await jp_fetch("mlx", "v1", "status")).body)
    assert status["ready"] and status["load"]["phase"] == "ready"


async def test_chats_sent_while_loading_complete_once_ready(weights_gate, jp_serverapp, jp_fetch, mlx_ext):
    """(`jp_fetch` is asked for because it is what makes pytest-jupyter's server listen.)"""
    from IPython.core.interactiveshell import InteractiveShell

    url, token = direct_url(jp_serverapp), jp_serverapp.identity_provider.token
    client = Client(url, api_key=token)
    seen_sync, seen_async = [], []
    sync_chat = asyncio.ensure_future(asyncio.to_thread(client.chat, "hi", max_tokens=4, progress=seen_sync.append))
    async_chat = asyncio.ensure_future(client.achat("hello", max_tokens=4, progress=seen_async.append))

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "mlx_nb")
    with capture_output():
        shell.run_line_magic("mlx", f"connect {url} --token {token}")

    def magic_cell():
        with capture_output() as cap:
            shell.run_cell("%%mlx chat -n 4\nhello from a notebook")
        return cap

    magic = asyncio.ensure_future(asyncio.to_thread(magic_cell))
    try:
        assert await until(lambda: seen_sync and seen_async), "no progress while the model loads"
        await asyncio.sleep(2.5)  # past one Retry-After: every chat is still waiting, none failed
        assert not (sync_chat.done() or async_chat.done() or magic.done())
        for status in (seen_sync[0], seen_async[0]):
            assert status["loading"] and status["load"]["phase"] == "loading weights"
    finally:
        weights_gate.set()
    replies = await asyncio.wait_for(asyncio.gather(sync_chat, async_chat), 60)
    assert all(r.finish_reason in ("stop", "length") and r.model == "tiny-llama" for r in replies)
    cap = await asyncio.wait_for(magic, 60)
    lines = [o.data.get("text/plain", "") for o in cap.outputs]
    assert any(line.startswith("⏳ loading tiny-llama: loading weights") for line in lines), lines
    assert lines[-1].startswith("tiny-llama · ") and "mlx:" not in cap.stderr, (lines, cap.stderr)
    with capture_output():
        shell.run_line_magic("mlx", "disconnect")
