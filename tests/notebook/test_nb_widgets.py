"""ChatPanel, CacheInspector and BatchVisualizer, headless (ipywidgets' DummyComm), on real tiny models."""

import html
import socket
import threading
import time
from datetime import datetime, timezone

import pytest

from mlx_nb.client import Client
from mlx_nb.client.content import request_source
from mlx_nb.widgets import BatchVisualizer, CacheInspector, ChatPanel
from mlx_nb.pictures.theme import svg_of


@pytest.fixture(scope="module")
def llama():
    return Client(model="tiny-llama", embedded=True).load()


def until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def shown(output) -> str:
    return output.outputs[0]["data"]["text/plain"] if output.outputs else ""


def press_enter(text_widget) -> None:
    """What the browser sends when Enter is pressed in a Text widget: a custom "submit" message."""
    text_widget._handle_msg({"content": {"data": {"method": "custom", "content": {"event": "submit"}}},
                             "buffers": []})


def test_chat_panel_sends_on_enter_only_and_streams_a_reply(llama):
    panel = ChatPanel(llama, max_tokens=16)
    assert panel.model.value == "tiny-llama" and "smollm2-135m-instruct" in panel.model.options
    panel.input.value = "hello panel"  # typed (synced as it is typed); leaving the box sends nothing
    assert not panel.busy and panel.transcript.children == ()
    press_enter(panel.input)
    assert panel.busy and panel.stop_button.disabled is False
    assert panel.wait(30)
    assert panel.input.value == ""
    assert [m["role"] for m in panel.messages] == ["user", "assistant"]
    assert panel.messages[0]["content"] == "hello panel"
    reply = panel.replies[-1]
    assert reply.finish_reason in ("stop", "length") and reply.text == panel.messages[1]["content"]
    bubble, answer = panel.transcript.children
    assert "hello panel" in bubble.value and shown(answer) == reply.text
    tokens = reply.usage["completion_tokens"]
    assert panel.speed.value.startswith(f"{tokens} token") and "≈" not in panel.speed.value
    assert html.escape(reply.text) in panel.copy.value and "disabled" not in panel.copy.value
    assert panel.send_button.disabled is False and panel.stop_button.disabled is True
    panel.send("and again")  # the second turn is sent with the first
    assert panel.wait(30) and len(panel.messages) == 4 and len(panel.transcript.children) == 4
    assert all(r.model == "tiny-llama" for r in panel.replies)
    panel.clear_button.click()
    assert panel.messages == [] and panel.transcript.children == () and "disabled" in panel.copy.value


def test_chat_panel_model_dropdown_picks_the_model_that_answers(llama):
    panel = ChatPanel(llama, max_tokens=8)
    panel.model.value = "tiny-gemma3"  # another offline model: its shared engine starts on first use
    panel.send("hello gemma")
    assert panel.wait(120)
    assert panel.replies[-1].model == "tiny-gemma3" and panel.replies[-1].finish_reason in ("stop", "length")
    bound = ChatPanel(Client(engine=llama.engine))
    assert bound.model.options == ("tiny-llama",)  # a client bound to one engine offers only its model


def test_stop_button_aborts_a_running_reply(llama):
    panel = ChatPanel(llama, max_tokens=4000)
    panel.send("write forever")
    assert until(lambda: panel._stream is not None and panel._stream.text)
    assert panel.send("ignored while busy") is None
    panel.stop_button.click()
    assert panel.wait(30)
    reply = panel.replies[-1]
    tokens = reply.usage["completion_tokens"]
    assert reply.finish_reason == "abort" and 0 < tokens < 4000
    assert shown(panel.transcript.children[-1]).endswith("*[stopped]*")
    assert panel.speed.value.startswith(f"{tokens} tokens") and panel.speed.value.endswith("· stopped")


def test_panel_waits_for_a_loading_model_showing_progress(monkeypatch):
    """A question sent while the model loads: the reply's place shows the load, then the reply."""
    import mlx_nb.models.loader as loader
    from mlx_nb.engine import Engine

    gate, real = threading.Event(), loader._load_text
    monkeypatch.setattr(loader, "_load_text", lambda *a, **k: gate.wait(60) and real(*a, **k))
    with Engine("tiny-llama") as engine:
        panel = ChatPanel(Client(engine=engine), max_tokens=4)
        panel.send("are you there?")
        try:
            assert until(lambda: shown(panel.transcript.children[-1]).startswith("⏳ loading tiny-llama: loading weights"))
            assert panel.speed.value == "waiting for the model to load" and panel.busy
        finally:
            gate.set()
        assert panel.wait(60) and panel.replies[-1].finish_reason in ("stop", "length")
        assert not shown(panel.transcript.children[-1]).startswith("⏳")


def test_stop_over_http_counts_what_arrived(live):
    """Over HTTP a stopped stream gets no final usage: the panel counts the chunks it received."""
    panel = ChatPanel(Client(live.url, api_key=live.token), max_tokens=4000)
    panel.send("write forever")
    assert until(lambda: panel._stream is not None and len(panel._stream.text) > 20)
    panel.stop()
    assert panel.wait(30)
    reply = panel.replies[-1]
    assert reply.finish_reason == "abort" and reply.usage["estimated"] and reply.usage["completion_tokens"] > 0
    assert panel.speed.value.startswith(f"≈{reply.usage['completion_tokens']} tokens")


def test_two_panels_stream_at_once(llama):
    a, b = ChatPanel(llama, max_tokens=48), ChatPanel(llama, max_tokens=48)
    since = llama.events()[-1]["seq"]
    a.send("first panel")
    b.send("second panel")
    assert a.wait(30) and b.wait(30)
    ra, rb = a.replies[-1], b.replies[-1]
    assert ra.finish_reason in ("stop", "length") and rb.finish_reason in ("stop", "length")
    both = {ra.request_id, rb.request_id}
    assert any(both <= set(e["requests"]) for e in llama.events(since) if e["kind"] == "step")


def test_uploaded_image_is_taken_once(llama):
    panel = ChatPanel(llama)
    png = b"\x89PNG\r\n\x1a\nfake"
    panel.upload.value = ({"name": "a.png", "type": "image/png", "size": len(png), "content": memoryview(png),
                           "last_modified": datetime.now(timezone.utc)},)
    assert panel._take_upload() == [png]
    assert panel.upload.value == () and panel._take_upload() == []


def dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}/mlx/v1"
    s.close()
    return url


def test_panel_shows_a_server_error_in_one_line():
    panel = ChatPanel(Client(dead_url(), model="m"))
    panel.send("anyone there?")
    assert panel.wait(30)
    text = shown(panel.transcript.children[-1])
    assert text.startswith("**mlx:** cannot reach") and "\n" not in text
    assert panel.messages == [] and panel.speed.value == "error"


def test_panel_opens_while_its_server_is_unreachable():
    """No model given and nobody answering: the panel still opens (model "?"), and a send says why."""
    panel = ChatPanel(Client(dead_url()))
    assert panel.model.value is None and panel.model.label == "?"
    panel.send("hello?")
    assert panel.wait(30) and shown(panel.transcript.children[-1]).startswith("**mlx:** cannot reach")


def test_picture_widgets_never_raise_on_an_unreachable_server():
    """Built, refreshed and closed with nobody answering: a note in the toolbar, no traceback, and
    the events reader (which keeps retrying, with a growing pause) ends with the widget."""
    client = Client(dead_url())
    viz, inspector = BatchVisualizer(client), CacheInspector(client, auto_refresh=True, interval=0.05)
    try:
        assert "cannot reach" in viz.note.value and "no batch events yet" in viz.svg
        assert until(lambda: "cannot reach" in inspector.note.value)
        inspector.refresh()
        viz.refresh()
        assert "cannot reach" in inspector.note.value
        readers = [t for t in threading.enumerate() if t.name == "mlx-nb-events"]
        assert readers
    finally:
        viz.close()
        inspector.close()
    assert until(lambda: not viz.live and not any(t.is_alive() for t in readers), 10)


def test_events_stop_on_a_refused_token(live):
    """A wrong token is final: the reader stops at once and says so, instead of retrying forever."""
    viz = BatchVisualizer(Client(live.url, api_key="wrong"))
    try:
        assert until(lambda: "401" in viz.note.value and "stopped" in viz.note.value), viz.note.value
        assert until(lambda: not any(t.name == "mlx-nb-events" and t.is_alive() for t in threading.enumerate()))
    finally:
        viz.close()


def test_rerunning_a_cell_closes_what_its_last_run_made(llama, monkeypatch):
    """A kernel tells which cell runs (its cellId): a new run of the same cell closes the old widgets."""
    from mlx_nb.widgets import lifecycle

    run = {"id": ("cell-1", "run-1")}
    monkeypatch.setattr(lifecycle, "current_cell", lambda: run["id"])
    first = [BatchVisualizer(llama), CacheInspector(llama, auto_refresh=True), ChatPanel(llama)]  # one run, kept
    assert all(w.comm is not None for w in first) and first[0].live
    run["id"] = ("cell-1", "run-2")
    second = BatchVisualizer(llama)
    try:
        assert all(w.comm is None for w in first) and until(lambda: not first[0].live)
        assert first[1]._stop.is_set() and second.comm is not None
        run["id"] = ("cell-2", "run-3")  # another cell leaves it alone
        other = CacheInspector(llama)
        assert second.comm is not None
    finally:
        second.close()
        other.close()


def test_widgets_carry_a_static_picture(llama):
    """The display bundle has the SVG as text/html beside the widget view (for GitHub, nbviewer,
    untrusted notebooks and HTML exports)."""
    for widget in (BatchVisualizer(llama, live=False), CacheInspector(llama)):
        bundle = widget._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert bundle["text/html"].startswith('<div class="mlx-nb-static"><img')
        assert svg_of(bundle["text/html"]) == [widget.svg]
        widget.close()


def test_cache_inspector_summarizes_a_fresh_cache(llama):
    inspector = CacheInspector(llama)
    layers = inspector.layout_data["layers"]
    assert len(layers) == 2 and inspector.svg.count('class="layer"') == 1  # two identical layers, one line
    assert "L0-1 KVCache" in inspector.svg and 'class="legend"' in inspector.svg
    assert inspector.note.value == "a fresh cache: no request is decoding"

    from mlx_nb.client import backends

    loaded = "tiny-qwen3.5" in backends._ENGINES  # another test may have started its engine already
    qwen = CacheInspector(Client(model="tiny-qwen3.5", embedded=True))
    if not loaded:  # its engine starts loading now: the inspector says so, and draws once loaded
        assert qwen.note.value.startswith("loading tiny-qwen3.5"), qwen.note.value
    assert until(lambda: qwen.layout_data, 60)
    types = [layer["type"] for layer in qwen.layout_data["layers"]]
    assert qwen.svg.count('class="layer"') == 2 and len(types) == 4  # SSM and attention layers
    assert 'data-type="ArraysCache"' in qwen.svg and 'data-type="KVCache"' in qwen.svg


def test_cache_inspector_follows_a_live_request(llama):
    st = llama.stream("go on", max_tokens=3000)
    next(st)
    inspector = CacheInspector(llama, request_id=st.request_id)
    assert st.request_id in inspector.svg and 'class="bar"' in inspector.svg  # real bytes now
    assert 'class="grid"' in inspector.svg and 'class="tok"' in inspector.svg  # its tokens, as positions
    inspector.follow(st.request_id, interval=0.02)
    assert until(lambda: inspector.note.value.startswith("following"))
    st.abort()
    list(st)
    assert until(lambda: inspector.note.value.endswith("finished"))
    inspector.refresh()  # the request is gone: a fresh cache, with a note saying why
    assert "no live request" in inspector.note.value
    inspector.close()


def test_batch_visualizer_shows_three_requests(llama):
    since = llama.events()[-1]["seq"]
    viz = BatchVisualizer(llama, since=since, max_hz=20)
    try:
        streams = [llama.stream(f"request {i}", max_tokens=24 if i else 3000) for i in range(3)]
        threads = [threading.Thread(target=lambda s=s: list(s)) for s in streams[1:]]
        for t in threads:
            t.start()
        next(streams[0])
        for t in threads:
            t.join(30)
        streams[0].abort()
        list(streams[0])
        assert until(lambda: viz.svg.count('class="mark leave') == 3), viz.svg[:300]
        svg = viz.svg
        assert svg.count('class="lane"') == 3
        assert svg.count('class="mark join"') == 3 and svg.count('class="mark insert"') == 3
        assert 'reason-abort' in svg and 'class="legend"' in svg and "<polyline" in svg
        source = request_source()  # python, or ipython when a test made an IPython shell
        assert all(f">request {i}<" in svg for i in range(3)) and f">{source}<" in svg  # prompt and source
        n = len(viz.events)
        viz.refresh()  # a pull after the live updates adds nothing twice
        assert len(viz.events) == n and viz.svg.count('class="lane"') == 3
    finally:
        viz.close()
