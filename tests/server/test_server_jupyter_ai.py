"""jupyter-ai's `%%ai` magic (the v3 line: jupyter-ai-magic-commands, which calls models through
litellm), unmodified and used as its docs say, against a real `jupyter mlx` process holding only
the scoped mlx API key: an alias pointing at the route, a first question, then a follow-up that
carries the conversation. Each answer must equal what the openai SDK gets for the same messages.

The server is started greedy with a small default budget: jupyter-ai sends neither a temperature
nor max_tokens, so that is what makes the two clients' answers comparable.
"""

import os

import openai
import pytest
from ipython_shell import mlx_shell
from live_server import serving
from server_helpers import MODEL

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm's documented offline switch


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    """pytest-jupyter's cleanup is for in-process servers; this module runs its own process."""
    yield


@pytest.fixture
def live(tmp_path):
    with serving(tmp_path, MODEL, "--MLXExtension.default_temperature=0",
                 "--MLXExtension.default_max_tokens=24") as server:
        yield server


@pytest.fixture
def shell(tmp_path, monkeypatch, live):
    monkeypatch.setenv("OPENAI_API_KEY", live.key)  # how litellm's openai provider takes its key
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    ip = mlx_shell(tmp_path / "ipython")
    ip.run_line_magic("load_ext", "jupyter_ai_magic_commands")
    try:
        yield ip
    finally:  # it installs a custom exception hook on the shared shell: give the hook back
        ip.run_line_magic("unload_ext", "jupyter_ai_magic_commands")


def ask(shell, cell: str):
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec
    return result.result


def test_jupyter_ai_magic_chats_through_the_route_with_the_scoped_key(shell, live, monkeypatch):
    registered = ask(shell, f"%ai alias mlx openai/{MODEL} --api-base {live.url}")
    assert registered._repr_mimebundle_()["text/plain"] == "Registered new alias `mlx`"
    since = live.last_seq()

    first = ask(shell, "%%ai mlx\nWhat is a batch?")
    reference = openai.OpenAI(base_url=live.url, api_key=live.key, max_retries=0)
    history = [{"role": "user", "content": "What is a batch?"}]
    expected = reference.chat.completions.create(model=MODEL, messages=history).choices[0].message.content
    # jupyter-ai reports a failed call by returning its message as a string: a display object means an answer
    assert not isinstance(first, str), first
    assert first.data == expected and expected

    second = ask(shell, "%%ai mlx\nAnd why share one?")
    history += [{"role": "assistant", "content": expected}, {"role": "user", "content": "And why share one?"}]
    assert second.data == reference.chat.completions.create(model=MODEL, messages=history).choices[0].message.content

    inserted = {r for e in live.events(since) if e["kind"] == "insert" for r in e["requests"]}
    assert len(inserted) == 4  # two from jupyter-ai, two from the reference: all through the one engine

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-server")  # a wrong key: told what to send, in one line
    refused = ask(shell, "%%ai mlx\nStill there?")
    assert isinstance(refused, str) and "AuthenticationError" in refused and "mlx API key" in refused
