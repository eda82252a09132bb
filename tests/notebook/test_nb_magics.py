"""%mlx and %%mlx chat through a real InteractiveShell, outputs captured as a kernel would send them."""

import os
import signal
import socket
import threading
import time

import pytest
from IPython.utils.capture import capture_output
from ipython_shell import mlx_shell, run_cell

from mlx_nb.magics import ChatAnswer, Conversation, interpolate
from mlx_nb.safe_markdown import safe_markdown


@pytest.fixture(scope="module")
def ip(tmp_path_factory):
    shell = mlx_shell(tmp_path_factory.mktemp("ipython"))
    with capture_output():
        shell.run_line_magic("mlx", "load tiny-llama")
    return shell


@pytest.fixture
def magics(ip, monkeypatch):
    m = ip.magics_manager.registry["MlxMagics"]
    monkeypatch.delenv("MLX_NB_NO_STREAM", raising=False)
    m.conversation.clear()
    yield m
    m.conversation.clear()


run = run_cell


def one_error_line(cap) -> str:
    lines = cap.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlx: "), cap.stderr
    assert "Traceback" not in cap.stdout + cap.stderr
    return lines[0]


def dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/mlx/v1"


def test_load_ext_registers_line_and_cell_magic(ip):
    assert "mlx" in ip.magics_manager.magics["line"]
    assert "mlx" in ip.magics_manager.magics["cell"]
    assert ip.magics_manager.registry["MlxMagics"].client.model == "tiny-llama"


def test_chat_streams_into_one_updated_display(ip, magics):
    answer, cap = run(ip, "%%mlx chat -n 24\nhello there")
    assert isinstance(answer, ChatAnswer) and answer.reply.finish_reason in ("stop", "length")
    first, updates, footer = cap.outputs[0], cap.outputs[1:-1], cap.outputs[-1]
    assert first.update is False and first.data["text/plain"].startswith("⏳ waiting for tiny-llama")
    display_id = first.transient["display_id"]
    assert updates and all(o.update is True and o.transient["display_id"] == display_id for o in updates)
    assert updates[-1].data["text/markdown"] == safe_markdown(str(answer))
    tokens = answer.reply.usage["completion_tokens"]
    assert footer.update is False and footer.data["text/plain"].startswith(f"tiny-llama · {tokens} token")
    assert footer.data["text/plain"].endswith(" s") or "stopped at max tokens" in footer.data["text/plain"]
    assert ip.user_ns["_"] is answer  # the cell's value ...
    assert not answer or str(answer) not in cap.stdout  # ... is not printed a second time


def test_updates_are_throttled(ip, magics):
    t0 = time.monotonic()
    answer, cap = run(ip, "%%mlx chat -n 400\ntell me everything")
    elapsed = time.monotonic() - t0
    assert answer.reply.usage["completion_tokens"] > 50
    assert len(cap.outputs) - 2 <= elapsed * magics.update_hz + 2  # ~10 Hz, not one update per token


def test_no_stream_env_gives_exactly_one_display(ip, magics, monkeypatch):
    monkeypatch.setenv("MLX_NB_NO_STREAM", "1")
    answer, cap = run(ip, "%%mlx chat -n 16\nhello")
    assert len(cap.outputs) == 2  # the answer, then its footer
    assert cap.outputs[0].update is False and cap.outputs[0].data["text/markdown"] == safe_markdown(str(answer))
    assert "tiny-llama · " in cap.outputs[1].data["text/plain"]


def test_value_is_hidden_in_its_cell_and_shown_later(ip, magics):
    answer, _ = run(ip, "%%mlx chat -n 8\nhi")
    count = ip.execution_count - 1
    assert ip.user_ns["Out"][count] is answer
    later, cap = run(ip, f"Out[{count}]")
    assert later is answer
    assert [o.data["text/markdown"] for o in cap.outputs] == [safe_markdown(str(answer))]
    # in its own cell the display formatter gets nothing to show (what a kernel's displayhook sends)
    ip.execution_count = answer.cell
    try:
        assert ip.display_formatter.format(answer) == ({}, {})
    finally:
        ip.execution_count = count + 2


def test_kernel_displayhook_sends_no_execute_result_for_the_answer(ip, magics):
    """ipykernel's own displayhook (fed a recording socket) skips the answer but sends other values."""
    from ipykernel.displayhook import ZMQShellDisplayHook
    from jupyter_client.session import Session

    class Socket:
        def __init__(self):
            self.sent = []

        def send_multipart(self, parts, *args, **kwargs):
            self.sent.append(parts)

    answer, _ = run(ip, "%%mlx chat -n 4\nhi")
    sock = Socket()
    hook = ZMQShellDisplayHook(shell=ip, session=Session(), pub_socket=sock)
    saved = ip.execution_count
    ip.execution_count = answer.cell
    try:
        hook(answer)
        assert sock.sent == []
        hook("an ordinary value")
        assert len(sock.sent) == 1 and b"execute_result" in b"".join(sock.sent[0])
    finally:
        ip.execution_count = saved


def test_terminal_ipython_is_detected_by_its_shell_class(ip):
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    from mlx_nb.magics.mlx_magics import _is_terminal

    assert not _is_terminal(ip)  # a kernel's (here: the base) shell streams Markdown displays
    assert _is_terminal(object.__new__(TerminalInteractiveShell))


def test_terminal_prints_plain_deltas(ip, magics):
    magics.terminal = True
    try:
        answer, cap = run(ip, "%%mlx chat -n 12\nhello")
    finally:
        magics.terminal = False
    assert cap.outputs == []
    assert str(answer) in cap.stdout


def test_history_grows_and_is_cleared(ip, magics):
    first, _ = run(ip, "%%mlx chat -n 6 -s 'You are terse.'\nfirst question")
    second, _ = run(ip, "%%mlx chat -n 6\nsecond question")
    assert len(magics.conversation) == 2
    assert second.reply.usage["prompt_tokens"] > first.reply.usage["prompt_tokens"] + 6  # the history was sent
    sent = magics.conversation.messages("third")
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert sent[0]["content"] == "You are terse." and sent[1]["content"] == "first question"
    run(ip, "%%mlx chat -n 6 --new\nfresh start")
    assert len(magics.conversation) == 1 and magics.conversation.system is None
    _, cap = run(ip, "%mlx reset")
    assert len(magics.conversation) == 0 and "conversation cleared" in cap.stdout


def test_config_reaches_the_client_and_history(ip, magics):
    run(ip, "%config MlxMagics.max_turns = 2")
    run(ip, "%config MlxMagics.model = 'tiny-qwen3.5'")
    try:
        assert magics.conversation.max_turns == 2 and magics.client.model == "tiny-qwen3.5"
        for i in range(3):
            answer, _ = run(ip, f"%%mlx chat -n 4\nquestion {i}")
        assert answer.reply.model == "tiny-qwen3.5"
        assert [q for q, _ in magics.conversation.turns] == ["question 1", "question 2"]
    finally:
        run(ip, "%config MlxMagics.max_turns = 20")
        run(ip, "%config MlxMagics.model = 'tiny-llama'")
    assert magics.client.model == "tiny-llama"


def test_history_is_capped():
    conv = Conversation(max_turns=3)
    for i in range(5):
        conv.add(f"q{i}", f"a{i}")
    assert [q for q, _ in conv.turns] == ["q2", "q3", "q4"]


def test_interpolation_replaces_known_names_only(ip, magics):
    class Paper:
        title = "Attention"

    ns = {"topic": "volcanoes", "paper": Paper(), "Out": {3: "three"}, "xs": [1, 2]}
    text = "{topic} {paper.title} {Out[3]} {xs[-1]} {unknown} {paper.nope} {{topic}} {'a': 1} f(x){y}"
    assert interpolate(text, ns) == "volcanoes Attention three 2 {unknown} {paper.nope} {{topic}} {'a': 1} f(x){y}"
    ip.user_ns["topic"] = "volcanoes"
    run(ip, "%%mlx chat -n 4\nTell me about {topic} and {not_defined_anywhere}.")
    assert magics.conversation.turns[-1][0] == "Tell me about volcanoes and {not_defined_anywhere}."


@pytest.mark.parametrize("source, expected", [
    ("%%mlx chat --bogus\nhi", "unrecognized arguments: --bogus"),
    ("%%mlx chat --max-tokens 0\nhi", "max_tokens must be"),
    ("%%mlx chat -t hot\nhi", "invalid float value"),
    ("%%mlx chat\n   ", "no question"),
    ("%mlx frobnicate", "unknown subcommand 'frobnicate'"),
    ("%%mlx status\nbody", "takes no cell body"),
    ("%mlx load no-such-model-xyz", "no-such-model-xyz"),
    ("%%mlx chat -i /no/such/image.png\nhi", "image not found"),
])
def test_errors_are_one_line(ip, magics, source, expected):
    answer, cap = run(ip, source)
    assert answer is None
    assert expected in one_error_line(cap)
    assert not any(o.update is False and o.data.get("text/markdown") for o in cap.outputs)
    assert len(magics.conversation) == 0


@pytest.mark.parametrize("source", ["%%mlx chat", "%%mlx chat -n 4\n", "%%mlx"])
def test_an_empty_chat_cell_gets_our_usage_line(ip, magics, source):
    """IPython's own 'the cell body is empty' message never shows: %mlx says what to write where."""
    answer, cap = run(ip, source)
    line = one_error_line(cap)
    assert answer is None and "no question" in line and "%%mlx chat" in line and "cell magic" not in line
    _, cap = run(ip, "%%mlx status")  # any other subcommand with nothing below runs as the line magic
    assert "mlx engine status" in cap.outputs[0].data["text/plain"]


def test_chat_waits_for_a_loading_model_showing_progress(ip, magics, monkeypatch):
    """An embedded engine still loading: the waiting line shows the load's phase, then the answer."""
    from mlx_nb.client import Client
    from mlx_nb.engine import Engine
    import mlx_nb.models.loader as loader

    gate, real = threading.Event(), loader._load_text
    monkeypatch.setattr(loader, "_load_text", lambda *a, **k: gate.wait(60) and real(*a, **k))
    engine = Engine("tiny-llama")
    saved, magics._client = magics._client, Client(engine=engine)
    result = {}
    try:
        cell = threading.Thread(target=lambda: result.update(out=run(ip, "%%mlx chat -n 4\nhello")))
        cell.start()
        time.sleep(1.0)  # the cell is waiting on the load (several progress rounds)
        assert cell.is_alive() and engine.status()["load"]["phase"] == "loading weights"
        gate.set()
        cell.join(60)
    finally:
        gate.set()
        magics._client = saved
        engine.close()
    answer, cap = result["out"]
    lines = [o.data.get("text/plain", "") for o in cap.outputs]
    assert any(line.startswith("⏳ loading tiny-llama: loading weights") for line in lines), lines
    assert answer.reply.finish_reason in ("stop", "length")
    assert lines[-2] == str(answer) and lines[-1].startswith("tiny-llama · ")


def test_status_cache_models_help(ip, magics):
    _, cap = run(ip, "%mlx status")
    html = cap.outputs[0].data["text/html"]
    assert "tiny-llama" in html and "embedded" in html and "batch size" in cap.outputs[0].data["text/plain"]
    assert "batched (matrix): llama: batched output equals" in cap.outputs[0].data["text/plain"]
    _, cap = run(ip, "%mlx cache")
    html, text = cap.outputs[0].data["text/html"], cap.outputs[0].data["text/plain"]
    assert html.count("<tr>") == 1 + 1  # header + one row for tiny-llama's two identical (empty) layers
    assert "0-1" in text and "KVCache" in text and "2 layers" in text
    _, cap = run(ip, "%mlx models")
    assert "smollm2-135m-instruct" in cap.outputs[0].data["text/plain"]
    assert "*  tiny-llama" in cap.outputs[0].data["text/plain"]
    _, cap = run(ip, "%mlx help")
    for sub in ("%%mlx chat", "%mlx load", "%mlx cache [--disk] [--request ID] [{prefix,save,load,clear}]", "%mlx connect", "%mlx reset", "%mlx batch"):
        assert sub in cap.stdout
    _, cap = run(ip, "%mlx")
    assert "%mlx status" in cap.stdout


def test_prefix_cache_save_load_clear(ip, magics, monkeypatch, tmp_path):
    from mlx_nb import Client, Engine

    _, cap = run(ip, "%mlx cache prefix")  # the shared engine: tests keep it in memory only
    assert "memory only" in cap.outputs[0].data["text/plain"]
    _, cap = run(ip, "%mlx cache save")
    assert "prefix_cache_dir" in one_error_line(cap)
    long_system = "You answer in one line about rivers and stones. " * 30
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), wait=True) as eng:
        monkeypatch.setattr(magics, "_client", Client(engine=eng))
        magics.client.chat("hello", system=long_system, max_tokens=4)
        _, cap = run(ip, "%mlx cache save")
        text = cap.outputs[0].data["text/plain"]
        assert "written to disk" in text and str(tmp_path) in text
        disk_row = next(line for line in text.splitlines() if line.startswith("disk"))
        assert disk_row.split()[1] == "1", text
        _, cap = run(ip, "%mlx cache clear")
        assert "cleared 1 entries" in cap.outputs[0].data["text/plain"]
        _, cap = run(ip, "%mlx cache load")
        html = cap.outputs[0].data["text/html"]
        assert "read from disk" in html and "<td style='text-align:left'>memory</td><td style='text-align:left'>1<" in html
        _, cap = run(ip, "%mlx cache clear --disk")
        assert ", 1 (" in cap.outputs[0].data["text/plain"] and not list(tmp_path.rglob("*.safetensors"))


def test_unload_frees_an_embedded_engine(ip, magics):
    from mlx_nb.client import backends

    _, cap = run(ip, "%mlx unload tiny-gemma3")
    assert cap.stdout.strip() == "mlx: tiny-gemma3 was not loaded"
    magics.client.chat("hi", model="tiny-gemma3", max_tokens=2)
    engine = backends._ENGINES["tiny-gemma3"]
    _, cap = run(ip, "%mlx unload tiny-gemma3")
    assert cap.stdout.strip() == "mlx: tiny-gemma3 unloaded"
    assert engine.closed and "tiny-gemma3" not in backends._ENGINES and "tiny-llama" in backends._ENGINES


def test_an_adapter_folder_is_loaded_chatted_with_and_unloaded(ip, magics, tmp_path):
    """`%mlx load MODEL@FOLDER` reads an mlx_lm adapter into the notebook's engine; chats then
    decode with it (as a separate Engine with that adapter alone answers); `%mlx unload` takes it off."""
    import sys
    from pathlib import Path

    from mlx_nb import Engine
    from mlx_nb.client import backends
    from mlx_nb.models.sources import resolve

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from lora_fixture import make_adapter

    folder = make_adapter(resolve("tiny-llama"), tmp_path / "terse", seed=4)
    text = "tell me about basalt"
    with Engine("tiny-llama", prefix_cache=False, wait=True) as alone:
        alone.load_adapter("terse", str(folder))
        want = alone.submit(messages=[{"role": "user", "content": text}], max_tokens=12, adapter="terse").result(60)
        plain = alone.submit(messages=[{"role": "user", "content": text}], max_tokens=12).result(60)
    assert want.text != plain.text
    try:
        _, cap = run(ip, f"%mlx load tiny-llama@{folder}")
        assert cap.stdout.strip().endswith("ready (text, context 4096 tokens)"), cap.stdout
        assert [a["name"] for a in backends._ENGINES["tiny-llama"].adapters()] == ["terse"]
        assert magics.client.chat(text, max_tokens=12).text == want.text
        assert magics.client.chat(text, max_tokens=12, model="tiny-llama").text == plain.text  # the same batch, no adapter
        answer, _ = run(ip, f"%%mlx chat -n 12\n{text}")
        assert answer.reply.text == want.text
    finally:
        _, cap = run(ip, f"%mlx unload tiny-llama@{folder}")
        run(ip, "%mlx load tiny-llama")
    assert cap.stdout.strip() == f"mlx: tiny-llama@{folder} unloaded"
    assert backends._ENGINES["tiny-llama"].adapters() == []


def test_cache_of_a_live_request(ip, magics):
    st = magics.client.stream("go on", max_tokens=3000)
    next(st)
    ip.user_ns["rid"] = st.request_id
    try:
        _, cap = run(ip, "%mlx cache --request {rid}")
        _, newest = run(ip, "%mlx cache")  # no id: the newest decoding request
    finally:
        st.abort()
        list(st)
    text = cap.outputs[0].data["text/plain"]
    assert st.request_id in text and "empty" not in text
    assert st.request_id in newest.outputs[0].data["text/plain"]


def test_batch_shows_a_visualizer(ip, magics):
    import ipywidgets

    _, cap = run(ip, "%mlx batch")
    model_id = cap.outputs[0].data["application/vnd.jupyter.widget-view+json"]["model_id"]
    viz = ipywidgets.widgets.widget._instances[model_id]
    assert "<svg" in viz.svg and not viz._closed.is_set()
    run(ip, "%mlx batch")  # showing it again stops the previous view's live updates
    assert viz._closed.is_set()
    magics._batch_view.close()


def test_connect_unreachable_then_disconnect(ip, magics, monkeypatch):
    url = dead_url()
    _, cap = run(ip, f"%mlx connect {url} --token abc")
    assert url in cap.stdout and magics.client.backend == url
    answer, cap = run(ip, "%%mlx chat\nhello?")
    assert answer is None and "cannot reach" in one_error_line(cap)
    assert len(magics.conversation) == 0
    _, cap = run(ip, "%mlx disconnect")
    assert magics.client.embedded and "embedded" in cap.stdout
    monkeypatch.delenv("MLX_NB_URL", raising=False)
    _, cap = run(ip, "%mlx connect")
    assert "MLX_NB_URL" in one_error_line(cap)
    answer, _ = run(ip, "%%mlx chat -n 4\nback home")
    assert answer.reply.finish_reason in ("stop", "length")


def interrupted_chat(ip, magics):
    """Run a long %%mlx chat and press Ctrl-C (a real SIGINT) once it streams: what the kernel does."""
    client = magics.client

    def interrupt():
        deadline = time.monotonic() + 20
        while not client._live and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    killer = threading.Thread(target=interrupt)
    killer.start()
    try:
        answer, cap = run(ip, "%%mlx chat -n 4000\nwrite a very long story")
    finally:
        killer.join()
        signal.signal(signal.SIGINT, previous)
    assert answer is None
    assert "interrupted" in one_error_line(cap) and "aborted" in cap.stderr
    assert len(magics.conversation) == 0


def left_the_batch(events, since: int) -> list[str]:
    """Why requests left the batch after `since`, once the engine has dropped them (at its next step)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leaves = [e for e in events(since) if e["kind"] == "filter"]
        if leaves:
            return [e["detail"]["reason"] for e in leaves]
        time.sleep(0.02)
    return []


def test_keyboard_interrupt_aborts_the_request(ip, magics):
    since = magics.client.events()[-1]["seq"]
    interrupted_chat(ip, magics)
    assert left_the_batch(magics.client.events, since) == ["abort"]
    assert magics.client.status()["batch_size"] == 0


def test_keyboard_interrupt_aborts_the_request_on_the_server(ip, magics, live):
    """A notebook connected to the server: Ctrl-C closes the stream and the server drops the request."""
    since = live.last_seq()
    run(ip, f"%mlx connect {live.url} --token {live.key}")
    try:
        assert magics.client.backend == live.url
        interrupted_chat(ip, magics)
    finally:
        run(ip, "%mlx disconnect")
    assert left_the_batch(live.events, since) == ["abort"]
    assert live.get("status")["batch_size"] == 0


@pytest.mark.slow
def test_real_model_knows_the_capital_of_france(ip, magics):
    answer, cap = run(ip, "%%mlx chat --model smollm2-135m-instruct -n 32\nWhat is the capital of France?")
    assert "Paris" in answer
    assert answer.reply.model == "smollm2-135m-instruct"


def test_chat_held_to_a_json_schema_named_by_a_variable(ip, magics):
    import json

    run(ip, "from pydantic import BaseModel, Field\n"
            "class Pet(BaseModel):\n    name: str = Field(max_length=8)\n    legs: int = Field(ge=0, le=8)\n"
            "pet_schema = {'type': 'object', 'properties': {'n': {'type': 'integer', 'minimum': 0, 'maximum': 9}},"
            " 'required': ['n'], 'additionalProperties': False}")
    for name in ("Pet", "pet_schema"):
        answer, _ = run(ip, f"%%mlx chat -t 1.0 -n 200 --json-schema {name}\ndescribe a pet")
        assert answer.reply.finish_reason == "stop"
        data = json.loads(str(answer))
        if name == "Pet":
            assert ip.user_ns["Pet"].model_validate(data)
        else:
            assert set(data) == {"n"} and 0 <= data["n"] <= 9
    answer, cap = run(ip, "%%mlx chat --json-schema no_such_variable\nhi")
    assert answer is None and "no variable 'no_such_variable'" in one_error_line(cap)
