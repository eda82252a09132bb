"""Past one machine: a `jupyter mlx` whose extension fronts another server (`backend_url`) instead of
loading a model. Real processes on loopback: mlx_lm's own server (an independent engine) serving a
tiny model, and another `jupyter mlx`; the front is reached the way notebooks reach it, with Jupyter
auth: the openai and anthropic SDKs, `%%mlx chat` in a shell connected to it, and a ChatPanel.
"""

import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest
from IPython.utils.capture import capture_output
from ipython_shell import mlx_shell
from live_server import free_port, serving
from server_helpers import MODEL

from mlx_nb.client import Client
from mlx_nb.models.sources import resolve
from mlx_nb.widgets import BatchVisualizer, ChatPanel

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    """pytest-jupyter's cleanup is for in-process servers; this module runs its own processes."""
    yield


@pytest.fixture(scope="module")
def mlx_lm_server(tmp_path_factory):
    """`python -m mlx_lm.server` serving the tiny model's folder: `http://127.0.0.1:<port>/v1`."""
    port, log = free_port(), tmp_path_factory.mktemp("mlx_lm") / "server.log"
    cmd = [sys.executable, "-m", "mlx_lm.server", "--model", str(resolve(MODEL)), "--host", "127.0.0.1",
           "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "mlx_lm.server not healthy in 60 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(scope="module")
def front(tmp_path_factory, mlx_lm_server):
    with serving(tmp_path_factory.mktemp("front"), MODEL, f"--MLXExtension.backend_url={mlx_lm_server}") as server:
        yield server


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    return mlx_shell(tmp_path_factory.mktemp("ipython"))


def test_openai_sdk_through_the_front_with_jupyter_auth(front):
    client = openai.OpenAI(base_url=front.url, api_key=front.token, max_retries=0)
    reply = client.chat.completions.create(model="any-name", messages=HI, max_tokens=5, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 5
    streamed = [c for c in client.chat.completions.create(model="any-name", messages=HI, max_tokens=5, temperature=0,
                                                           stream=True)]
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == reply.choices[0].message.content  # greedy on mlx_lm's engine, both ways
    assert [m.id for m in client.models.list()]
    with pytest.raises(openai.AuthenticationError):  # the backend is open; the front is not
        openai.OpenAI(base_url=front.url, api_key="wrong", max_retries=0).chat.completions.create(
            model="m", messages=HI, max_tokens=2)
    completion = client.completions.create(model="m", prompt="Once upon", max_tokens=3)
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_anthropic_and_responses_clients_are_translated_for_a_chat_only_backend(front):
    claude = anthropic.Anthropic(base_url=front.base + "/mlx", api_key=front.token, max_retries=0)
    message = claude.messages.create(model="claude-team-default", max_tokens=5, messages=HI)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens <= 5
    with claude.messages.stream(model="claude-team-default", max_tokens=5, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens")
    responses = openai.OpenAI(base_url=front.url, api_key=front.token, max_retries=0).responses
    made = responses.create(model="gpt-4.1", input="hi", max_output_tokens=4)
    assert made.status in ("completed", "incomplete") and made.usage.output_tokens <= 4


def test_status_says_what_the_backend_does_not_expose(front):
    status = front.get("status")
    assert status["backend"].endswith("/v1") and status["ready"]
    assert status["exposes"] == {"status": False, "metrics": False, "slots": False}
    assert "exposes no /status, /metrics, /slots" in status["not_exposed"]
    r = front.http.get(f"{front.url}/events", params={"stream": 0})
    assert r.status_code == 404 and "exposes no batch events" in r.json()["error"]["message"]
    visual = BatchVisualizer(Client(front.url, front.token), live=True)
    assert "exposes no batch events" in visual.unavailable and "No batch timeline" in visual.svg
    visual.close()


def test_chat_magic_and_chat_panel_through_the_front(front, shell):
    magics = shell.magics_manager.registry["MlxMagics"]
    with capture_output():
        shell.run_line_magic("mlx", f"connect {front.url} --token {front.token}")
    try:
        magics.conversation.clear()
        with capture_output() as cap:
            result = shell.run_cell("%%mlx chat --max-tokens 6\nhello through the front", store_history=True)
        assert result.error_in_exec is None and "mlx:" not in cap.stderr, cap.stderr
        assert len(magics.conversation) == 1  # one turn answered, through the front and mlx_lm's server
        with capture_output() as cap:
            shell.run_line_magic("mlx", "status")
        shown = cap.stdout + "".join(str(o.data) for o in cap.outputs)
        assert "fronting" in shown and "not shown" in shown
    finally:
        with capture_output():
            shell.run_line_magic("mlx", "disconnect")

    panel = ChatPanel(Client(front.url, front.token), max_tokens=6)
    panel.send("hello panel")
    assert panel.wait(60)
    reply = panel.replies[-1]
    assert reply.finish_reason in ("stop", "length") and reply.text == panel.messages[-1]["content"]
    panel.close()


def test_a_front_for_another_jupyter_mlx_shows_its_batch(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("back"), MODEL) as back, serving(
        tmp_path_factory.mktemp("front2"), MODEL, f"--MLXExtension.backend_url={back.url}",
        f"--MLXExtension.backend_api_key={back.token}",
    ) as front2:
        client = openai.OpenAI(base_url=front2.url, api_key=front2.token, max_retries=0)
        since = back.last_seq()
        reply = client.chat.completions.create(model="x", messages=HI, max_tokens=4)
        assert reply.model == MODEL
        status = front2.get("status")
        assert status["exposes"]["status"] and status["model"] == MODEL and "steps" in status
        events = front2.get("events", stream=0, since=since)
        assert {"insert", "step"} <= {e["kind"] for e in events}
        counted = front2.http.post(f"{front2.url}/messages/count_tokens", json={"messages": HI}).json()
        assert counted["input_tokens"] == reply.usage.prompt_tokens
