"""The Lab's own view of the shared engine (labextension/), in a real browser.

`make lab` / `make test` build the extension and link it into the venv (scripts/build-labextension.sh),
so `jupyter labextension list` lists it enabled. A `jupyter lab` process serves a tiny llama; two
clients chat at once, each naming its notebook (X-MLX-Source, as mlx_nb's Client does): the status
bar shows batch 2, the MLX sidebar lists both by notebook, and its Abort button ends one while the
other completes. Text contrast is measured in the light and the dark theme; screenshots land in
test-output/browser/. The extension's settings (poll interval, timeline lanes, chat length) take
effect when changed in the Settings Editor; its status poll backs off while the engine's route
fails, returns to its interval when it answers, and stands by while the page is hidden.
"""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from lab_server import MS, WAIT_S, Lab, _shot, extension_installed, menu, open_notebook, watched
from page_checks import weakest_contrast

pytestmark = pytest.mark.browser

NOTEBOOKS = ("notebook one.ipynb", "notebook two.ipynb")
HOSTILE = '<img src=x onerror="window.__mlx_xss=1"><script>window.__mlx_xss=2</script>'  # a request's own text


@contextmanager
def long_llama_lab(root: Path):
    """A tiny llama with a 64k context: its chats outlast every step of a test on a loaded machine."""
    from mlx_nb.compat.configs import write_tiny

    extension_installed()
    model = write_tiny("llama", root / "long-llama", 7, {"max_position_embeddings": 65536})
    (root / "lab").mkdir()
    with Lab(root / "lab", ["1 + 1"], model=str(model), args=(f"--MLXExtension.jobs_dir={root / 'jobs'}",)) as server:
        yield server


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    """One Lab for the tests that need nothing else (starting one takes a while)."""
    with long_llama_lab(tmp_path_factory.mktemp("labext")) as server:
        yield server


@pytest.fixture
def own_lab(tmp_path):
    """A Lab of its own, for a test that counts its page's polls from the server's first answer."""
    with long_llama_lab(tmp_path) as server:
        yield server


# What a test may change and the next must not inherit: the extension's settings and the theme.
RESET_SETTINGS = ("lab/api/settings/mlx-nb-labextension:plugin", "lab/api/settings/@jupyterlab/apputils-extension:themes")


@pytest.fixture
def lab(shared_lab):
    """The shared Lab with its settings back to their defaults and no request running."""
    for route in RESET_SETTINGS:
        r = httpx.put(f"{shared_lab.base}/{route}", json={"raw": "{}"}, timeout=30, trust_env=False,
                      headers={"Authorization": f"token {shared_lab.token}"})
        assert r.status_code == 204, (route, r.text)
    key = (shared_lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
    for _ in range(300):
        status = httpx.get(f"{shared_lab.base}/mlx/v1/status", timeout=30, trust_env=False,
                           headers={"Authorization": f"Bearer {key}"}).json()
        if not status.get("requests"):
            break
        time.sleep(0.1)
    return shared_lab


def chat(lab: Lab, source: str, max_tokens: int, out: dict) -> None:
    """A streamed chat from `source`, its end-of-sequence token pushed down so it runs its budget."""
    key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
    body = {"model": "m", "messages": [{"role": "user", "content": f"{HOSTILE} hello from {source}"}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "logit_bias": {"258": -100}}
    reasons = []
    with httpx.Client(timeout=WAIT_S, trust_env=False) as http, http.stream(
            "POST", f"{lab.base}/mlx/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {key}", "X-MLX-Source": source}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                out.setdefault("id", chunk["id"].removeprefix("chatcmpl-"))
                reasons += [c["finish_reason"] for c in chunk.get("choices", []) if c.get("finish_reason")]
    out["reasons"] = reasons


def ended(lab: Lab, request_id: str) -> str:
    """Why the engine says a request left the batch (its `filter` event)."""
    key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
    events = httpx.get(f"{lab.base}/mlx/v1/events", params={"stream": 0}, timeout=30, trust_env=False,
                       headers={"Authorization": f"Bearer {key}"}).json()
    return next(e["detail"]["reason"] for e in events if e["kind"] == "filter" and request_id in e["requests"])


WITHOUT_GHOST = ("el => { const c = el.cloneNode(true); c.querySelectorAll('.jp-GhostText').forEach(g => g.remove()); "
                 "return [...c.querySelectorAll('.cm-line')].map(line => line.textContent).join('\\n'); }")


def cell_text(page, editor, longer_than: int) -> str:
    """The cell's own text (no ghost text) once it is longer than `longer_than`: a suggestion was
    accepted into it (a next one may show at once, the completer fires as you type)."""
    page.wait_for_function(f"([el, n]) => ({WITHOUT_GHOST})(el).length > n",
                           arg=[editor.element_handle(), longer_than], timeout=10 * MS)
    return editor.evaluate(WITHOUT_GHOST)


def picture_fit(svg) -> dict:
    """How a batch picture sits in the page: its drawn and shown widths, the room its panel gives
    it, and the texts whose rendered box crosses the picture's edges (names, axis, legend)."""
    return svg.evaluate("""svg => {
        const box = svg.getBoundingClientRect();
        const texts = [...svg.querySelectorAll('text')].filter(t => t.getBoundingClientRect().width > 0);
        const outside = texts.filter(t => { const b = t.getBoundingClientRect();
            return b.left < box.left - 0.5 || b.right > box.right + 0.5; }).map(t => t.textContent);
        return {drawn: +svg.getAttribute('width'), shown: Math.round(box.width),
                room: svg.parentElement.clientWidth, outside, texts: texts.length};
    }""")


def test_status_bar_and_sidebar_show_both_notebooks_and_abort_one(lab, page):
    from playwright.sync_api import expect

    with watched(page, lab) as errors:
        page.goto(f"{lab.base}/lab?token={lab.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("long-llama · ready", timeout=WAIT_S * MS)

        long_one, short_one = {}, {}
        threads = [threading.Thread(target=chat, args=(lab, NOTEBOOKS[0], 60000, long_one)),
                   threading.Thread(target=chat, args=(lab, NOTEBOOKS[1], 12000, short_one))]
        for t in threads:
            t.start()
        expect(page.locator(".mlx-nb-StatusItem[data-batch='2']")).to_have_count(1, timeout=WAIT_S * MS)
        expect(item).to_contain_text("batch 2")

        item.click()  # opens the sidebar
        sidebar = page.locator("#mlx-nb-sidebar")
        expect(sidebar).to_be_visible()
        rows = sidebar.locator(".mlx-nb-Request")
        expect(rows).to_have_count(2, timeout=WAIT_S * MS)
        sources = sorted(rows.locator(".mlx-nb-Request-source").all_inner_texts())
        assert sources == sorted(NOTEBOOKS)
        labels = rows.locator(".mlx-nb-Request-label").all_inner_texts()
        assert labels and all(label.startswith(HOSTILE[:16]) for label in labels), labels  # shown as text
        timeline = sidebar.locator("svg.mlx-batch")  # the picture the notebook widget draws
        expect(timeline.locator("g.lane")).to_have_count(2, timeout=WAIT_S * MS)
        assert sorted(NOTEBOOKS) == sorted(n for n in NOTEBOOKS if n in timeline.inner_html())
        assert page.evaluate("window.__mlx_xss") is None  # nothing of the requests' text ran
        for _ in range(40):  # the next poll redraws it for the sidebar's width (a scroll bar may take some)
            fit = picture_fit(timeline)
            if abs(fit["shown"] - fit["drawn"]) <= 1 and fit["drawn"] <= fit["room"]:
                break
            page.wait_for_timeout(500)
        assert abs(fit["shown"] - fit["drawn"]) <= 1 and fit["drawn"] <= fit["room"], fit  # drawn for the sidebar
        assert fit["outside"] == [], fit
        for width in (320, 1000):  # the picture alone at a 320-px sidebar's width and a wide one's
            picture = httpx.get(f"{lab.base}/mlx/v1/batch.svg", params={"width": width}, timeout=30, trust_env=False,
                                headers={"Authorization": f"token {lab.token}"}).text
            other = page.context.new_page()
            other.set_content(f'<div style="width:{width}px">{picture}</div>')
            fit = picture_fit(other.locator("svg.mlx-batch"))
            other.close()
            assert fit["shown"] == fit["drawn"] == width and fit["outside"] == [] and fit["texts"] > 10, (width, fit)
        worst, where = weakest_contrast(sidebar.locator(".mlx-nb-Request-source, .mlx-nb-Request-progress, "
                                                        ".mlx-nb-Sidebar-header, .mlx-nb-Request-abort"))
        assert worst >= 4.5, f"light theme: {where} ({worst:.2f})"
        _shot(page, "labext-light-01-two-notebooks")

        rows.filter(has_text=NOTEBOOKS[1]).locator(".mlx-nb-Request-source").click()  # select: its cache shows
        cache = sidebar.locator("svg.mlx-cache")
        expect(cache.locator("g.grid").first).to_be_visible(timeout=WAIT_S * MS)
        assert "request " in cache.inner_html() and short_one.get("id", "") in cache.inner_html()
        fit = picture_fit(cache)  # drawn for the sidebar too
        assert abs(fit["shown"] - fit["drawn"]) <= 1 and fit["outside"] == [], fit

        rows.filter(has_text=NOTEBOOKS[0]).locator(".mlx-nb-Request-abort").click()
        threads[0].join(WAIT_S)
        assert long_one["reasons"] == ["stop"], long_one  # the wire's word for it: its budget was 60,000
        assert ended(lab, long_one["id"]) == "abort"  # and the engine's
        expect(rows).to_have_count(1, timeout=WAIT_S * MS)
        expect(rows.first.locator(".mlx-nb-Request-source")).to_have_text(NOTEBOOKS[1])

        menu(page, "Settings", "Theme", "JupyterLab Dark")
        expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1, timeout=60 * MS)
        page.wait_for_timeout(1000)
        if rows.count():
            worst, where = weakest_contrast(sidebar.locator(".mlx-nb-Request-source, .mlx-nb-Request-progress, "
                                                            ".mlx-nb-Sidebar-header, .mlx-nb-Request-abort"))
            assert worst >= 4.5, f"dark theme: {where} ({worst:.2f})"
        _shot(page, "labext-dark-01-one-left")

        menu(page, "Settings", "Theme", "JupyterLab Dark High Contrast")
        expect(page.locator("body[data-jp-theme-name='JupyterLab Dark High Contrast']")).to_have_count(
            1, timeout=60 * MS)
        page.wait_for_timeout(1000)
        worst, where = weakest_contrast(sidebar.locator(".mlx-nb-Sidebar-header, .mlx-nb-Chat-send, .mlx-nb-Chat-input"))
        assert worst >= 4.5, f"high contrast theme: {where} ({worst:.2f})"
        _shot(page, "labext-high-contrast-01")

        threads[1].join(WAIT_S)
        assert short_one["reasons"] == ["length"], short_one  # the other one completed its budget
        expect(rows).to_have_count(0, timeout=WAIT_S * MS)
        assert not errors, errors
        assert Path(lab.log_path).exists()


def test_sidebar_lists_a_running_job_and_its_stop_button_cancels_it(lab, page):
    """A dataset job (an OpenAI batch) shows in the sidebar as one line with its rows and speed, not as
    its rows one by one; Stop cancels it and the rows it finished are kept."""
    from playwright.sync_api import expect

    key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
    auth = {"Authorization": f"Bearer {key}"}
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"max_tokens": 3000, "temperature": 0, "logit_bias": {"258": -100},  # no end of text
                                  "messages": [{"role": "user", "content": f"row {i}"}]}})
             for i in range(64)]
    upload = httpx.post(f"{lab.base}/mlx/v1/files", headers=auth, trust_env=False, timeout=WAIT_S,
                        files={"file": ("rows.jsonl", "\n".join(lines).encode())}, data={"purpose": "batch"}).json()
    batch = httpx.post(f"{lab.base}/mlx/v1/batches", headers=auth, trust_env=False, timeout=WAIT_S,
                       json={"input_file_id": upload["id"], "endpoint": "/v1/chat/completions",
                             "completion_window": "24h"}).json()
    with watched(page, lab, "labext-07-job") as errors:
        page.goto(f"{lab.base}/lab?token={lab.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("ready", timeout=WAIT_S * MS)
        item.click()
        job = page.locator(f"#mlx-nb-sidebar .mlx-nb-Job[data-id='{batch['id']}']")
        expect(job).to_contain_text("/64 rows", timeout=WAIT_S * MS)
        expect(page.locator("#mlx-nb-sidebar .mlx-nb-Request")).to_have_count(0)  # its rows are not listed
        _shot(page, "labext-light-07-job")
        job.locator(".mlx-nb-Job-stop").click()
        expect(job).to_have_count(0, timeout=WAIT_S * MS)  # gone from the list once it is cancelled
        assert not errors, errors
    status = httpx.get(f"{lab.base}/mlx/v1/batches/{batch['id']}", headers=auth, trust_env=False, timeout=WAIT_S).json()
    assert status["status"] == "cancelled" and status["request_counts"]["completed"] < 64


def test_sidebar_chat_streams_and_stops(lab, page):
    """The sidebar's chat box: an answer streams in (rendered as untrusted Markdown); Stop ends the
    next one mid-answer, and the engine records that request, sent as "Lab sidebar chat", as aborted."""
    from playwright.sync_api import expect

    with watched(page, lab, "labext-99-chat-failure") as errors:
        page.goto(f"{lab.base}/lab?token={lab.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("long-llama · ready", timeout=WAIT_S * MS)
        item.click()
        box = page.locator("#mlx-nb-sidebar .mlx-nb-Chat")
        expect(box).to_have_class(re.compile(r"\blm-Widget\b"))  # a Lumino widget, the sidebar's child
        box.locator(".mlx-nb-Chat-input").fill("What is the capital of France?")
        box.locator(".mlx-nb-Chat-input").press("Enter")
        answers = box.locator(".mlx-nb-Chat-assistant")
        expect(answers.first).to_have_attribute("data-finish", re.compile("stop|length"), timeout=WAIT_S * MS)
        assert answers.first.inner_text().strip() not in ("", "…")
        worst, where = weakest_contrast(box.locator(".mlx-nb-Chat-turn, .mlx-nb-Chat-send, .mlx-nb-Chat-input"))
        assert worst >= 4.5, f"{where} ({worst:.2f})"
        _shot(page, "labext-light-02-chat")

        # A random tiny model may end an answer by itself before Stop lands (the engine then says
        # "stop", though the box shows it stopped): ask again, a few times.
        stop = box.locator(".mlx-nb-Chat-stop")
        key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
        for attempt in range(1, 6):
            box.locator(".mlx-nb-Chat-input").fill(f"Tell me a very long story, take {attempt}.")
            box.locator(".mlx-nb-Chat-send").click()
            answer = answers.nth(attempt)
            expect(answer).not_to_have_text("…", timeout=WAIT_S * MS)  # the first pieces came
            if stop.is_enabled():
                stop.click(timeout=2 * MS, force=True)
            expect(answer).to_have_attribute("data-finish", re.compile("."), timeout=WAIT_S * MS)
            if answer.get_attribute("data-finish") != "stopped":
                continue
            for _ in range(100):  # the engine ends it at its next step
                events = httpx.get(f"{lab.base}/mlx/v1/events", params={"stream": 0}, timeout=30, trust_env=False,
                                   headers={"Authorization": f"Bearer {key}"}).json()
                chats = [e["requests"][0] for e in events if e["kind"] == "insert"
                         and e["detail"].get("source") == "Lab sidebar chat"]
                reasons = {r: e["detail"].get("reason") for e in events if e["kind"] == "filter" for r in e["requests"]}
                if len(chats) == attempt + 1 and chats[-1] in reasons:
                    break
                page.wait_for_timeout(100)
            if reasons.get(chats[-1]) == "abort":
                break
        assert answer.get_attribute("data-finish") == "stopped", "every answer ended before Stop landed"
        assert reasons.get(chats[-1]) == "abort", (chats, reasons)
        assert not errors, errors


SETTINGS_ROUTE = "lab/api/settings/mlx-nb-labextension:plugin"  # the extension's settings, schema/plugin.json


def route_is(url: str, route: str) -> bool:
    """Whether `url` is a request to the engine's `route` (the Lab adds a cache-busting query)."""
    return urlparse(url).path.endswith(f"/mlx/v1/{route}")


def count_during(page, seen: list, ms: int) -> int:
    """How many requests land in `seen` (filled by a page.on("request") handler) in the next `ms`."""
    before = len(seen)
    page.wait_for_timeout(ms)
    return len(seen) - before


def change_setting(page, title: str, value: str) -> None:
    """Type `value` into the Settings Editor's field `title` (MLX engine), until the Lab saved it."""
    field = page.locator(f".jp-SettingsPanel input[label='{title}']")
    with page.expect_response(lambda r: r.request.method == "PUT" and SETTINGS_ROUTE in r.url) as saved:
        field.fill(value)
    assert saved.value.status == 204, saved.value.text()


def test_settings_editor_changes_take_effect_without_a_reload(lab, page):
    """The "MLX engine" settings in the Lab's Settings Editor apply as they are saved: a longer poll
    interval quiets the status polls, the timeline asks for the lanes set, the chat for its length,
    and a shorter interval brings the polls back."""
    from playwright.sync_api import expect

    with watched(page, lab, "labext-99-settings-failure") as errors:
        polls, pictures = [], []
        page.on("request", lambda r: polls.append(r.url) if route_is(r.url, "status") else None)
        page.on("request", lambda r: pictures.append(r.url) if route_is(r.url, "batch.svg") else None)
        page.goto(f"{lab.base}/lab?token={lab.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("long-llama · ready", timeout=WAIT_S * MS)
        item.click()  # the sidebar shows: each poll redraws its timeline too
        with page.expect_request(lambda r: route_is(r.url, "batch.svg")) as first:
            pass
        assert parse_qs(urlparse(first.value.url).query)["lanes"] == ["12"]  # the default
        assert count_during(page, polls, 4000) >= 2  # every second, by default

        menu(page, "Settings", "Settings Editor")
        page.locator(".jp-PluginList-entry", has_text="MLX engine").click()
        change_setting(page, "Status poll interval (ms)", "60000")
        # the settings apply in the order saved: once the timeline asks for 3 lanes, the minute applies
        with page.expect_request(lambda r: route_is(r.url, "batch.svg") and "lanes=3&" in r.url,
                                 timeout=WAIT_S * MS):
            change_setting(page, "Timeline lanes", "3")
        assert count_during(page, polls, 5000) <= 1, polls[-4:]  # the next poll is a minute away
        _shot(page, "labext-light-05-settings")

        change_setting(page, "Chat answer length (tokens)", "5")
        box = page.locator("#mlx-nb-sidebar .mlx-nb-Chat")
        expect(box).to_have_attribute("data-max-tokens", "5", timeout=WAIT_S * MS)  # saved, then applied
        with page.expect_request(lambda r: route_is(r.url, "chat/completions")) as asked:
            box.locator(".mlx-nb-Chat-input").fill("Hello?")
            box.locator(".mlx-nb-Chat-input").press("Enter")
        assert asked.value.post_data_json["max_tokens"] == 5
        expect(box.locator(".mlx-nb-Chat-assistant").first).to_have_attribute(
            "data-finish", re.compile("."), timeout=WAIT_S * MS)

        change_setting(page, "Status poll interval (ms)", "250")
        assert count_during(page, polls, 4000) >= 3  # polling again, faster than the default
        assert all(parse_qs(urlparse(url).query)["lanes"] == ["3"] for url in pictures[-3:]), pictures[-3:]
        assert not errors, errors


HIDE_PAGE = """hidden => {
  if (hidden) {
    Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
  } else {
    delete document.visibilityState;  // the prototype's getter again: 'visible'
  }
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_status_poll_backs_off_while_the_engine_fails_and_stands_by_while_hidden(own_lab, page):
    """With a 250-ms poll interval saved before the page loads: while the status route answers 503
    the poll backs off (far fewer requests than a fixed 250-ms loop would make), it returns to its
    interval once the route answers again, and it stops while the page is hidden. Counts, not
    timings: each bound is several times the distance between the two behaviours' expected counts."""
    from playwright.sync_api import expect

    lab = own_lab
    saved = httpx.put(f"{lab.base}/{SETTINGS_ROUTE}", json={"raw": json.dumps({"pollInterval": 250})},
                      headers={"Authorization": f"token {lab.token}"}, timeout=30, trust_env=False)
    assert saved.status_code == 204, saved.text  # the server knows the schema: the extension's build ships it
    refused = httpx.put(f"{lab.base}/{SETTINGS_ROUTE}", json={"raw": json.dumps({"pollInterval": 10})},
                        headers={"Authorization": f"token {lab.token}"}, timeout=30, trust_env=False)
    assert refused.status_code == 400, refused.text  # below the schema's minimum

    with watched(page, lab, "labext-99-backoff-failure") as errors:
        polls = []
        page.on("request", lambda r: polls.append(r.url) if route_is(r.url, "status") else None)
        page.goto(f"{lab.base}/lab?token={lab.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("long-llama · ready", timeout=WAIT_S * MS)
        assert count_during(page, polls, 4000) >= 8  # the saved 250 ms (the default 1000 ms makes 4 or 5)

        def status(url: str) -> bool:
            return route_is(url, "status")

        def unavailable(route) -> None:
            route.fulfill(status=503, content_type="application/json", body='{"error": "test"}')

        page.route(status, unavailable)
        expect(item).to_have_attribute("data-state", "error", timeout=WAIT_S * MS)
        expect(item).to_contain_text("status 503")
        failing = count_during(page, polls, 10000)
        assert failing < 20, f"{failing} polls in 10 s of failures: a fixed 250-ms loop makes 40"

        page.unroute(status, unavailable)
        expect(item).to_contain_text("long-llama · ready", timeout=WAIT_S * MS)  # within the 10 s back-off limit
        recovered = count_during(page, polls, 4000)
        assert recovered >= 6, f"{recovered} polls in 4 s once the engine answers (failing: {failing} in 10 s)"

        page.evaluate(HIDE_PAGE, True)
        hidden = count_during(page, polls, 4000)
        assert hidden <= 2, f"{hidden} polls in 4 s while hidden (one tick lingers)"
        page.evaluate(HIDE_PAGE, False)
        assert count_during(page, polls, 4000) >= 6  # back to the interval once the page shows
        assert not errors, errors


def test_sidebar_lists_the_servers_models_and_their_states(tmp_path, page):
    """A server of two models: the sidebar lists both with their states, and once a request names
    the second one it shows it loaded and the status bar counts it; light and dark themes."""
    from playwright.sync_api import expect

    extension_installed()
    (tmp_path / "lab").mkdir()
    with Lab(tmp_path / "lab", ["1 + 1"], model="tiny-llama", args=("--MLXExtension.models=tiny-gemma3",)) as two, \
            watched(page, two, "labext-99-models-failure") as errors:
        page.goto(f"{two.base}/lab?token={two.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("tiny-llama · ready", timeout=WAIT_S * MS)
        item.click()
        models = page.locator("#mlx-nb-sidebar .mlx-nb-Model")
        expect(models).to_have_count(2, timeout=WAIT_S * MS)
        expect(models.nth(0)).to_have_attribute("data-state", "loaded")
        expect(models.nth(1)).to_have_attribute("data-state", "available")
        expect(models.nth(1)).to_contain_text("tiny-gemma3")

        key = (two.root / "runtime" / "mlx-nb-api-key").read_text().strip()
        r = httpx.post(f"{two.base}/mlx/v1/chat/completions", timeout=WAIT_S, trust_env=False,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "tiny-gemma3", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["model"] == "tiny-gemma3", r.text
        expect(models.nth(1)).to_have_attribute("data-state", "loaded", timeout=WAIT_S * MS)
        expect(models.nth(1)).to_contain_text("loaded · reserves")
        expect(item).to_contain_text("tiny-llama (+1) · ready")
        worst, where = weakest_contrast(models.locator("span"))
        assert worst >= 4.5, f"light theme: {where} ({worst:.2f})"
        _shot(page, "labext-light-06-two-models")

        menu(page, "Settings", "Theme", "JupyterLab Dark")
        expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1, timeout=60 * MS)
        page.wait_for_timeout(1000)
        worst, where = weakest_contrast(models.locator("span"))
        assert worst >= 4.5, f"dark theme: {where} ({worst:.2f})"
        _shot(page, "labext-dark-06-two-models")
        assert not errors, errors


def test_inline_completion_in_a_code_cell_and_tab_accepts_it(lab, page):
    """Typing in a code cell shows the shared engine's continuation as ghost text (its request
    shows in the batch as source "completer"); Tab accepts it into the cell."""
    from playwright.sync_api import expect

    key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
    before = httpx.get(f"{lab.base}/mlx/v1/events", params={"stream": 0}, timeout=30, trust_env=False,
                       headers={"Authorization": f"Bearer {key}"}).json()
    since = before[-1]["seq"] if before else 0
    with watched(page, lab, "labext-99-inline-failure") as errors:
        notebook, _ = open_notebook(lab, page)
        editor = notebook.locator(".jp-Cell").first.locator(".cm-content")
        editor.click()
        page.keyboard.press("End")
        typed = "\nprint('hello"
        page.keyboard.type(typed, delay=30)
        ghost = page.locator(".jp-GhostText")
        try:
            expect(ghost).to_have_count(1, timeout=20 * MS)  # as the user types (the inline completer's default)
        except AssertionError:
            page.keyboard.press("Alt+\\\\")  # or on request, as its shortcut asks
            expect(ghost).to_have_count(1, timeout=WAIT_S * MS)
        suggestion = ghost.inner_text()
        assert suggestion
        _shot(page, "labext-light-03-inline-completion")
        page.keyboard.press("Tab")
        # accepted into the cell (a next suggestion may show at once: the completer fires as you type)
        text = cell_text(page, editor, len(lab.cells[0] + typed))
        assert text.startswith(lab.cells[0] + "\nprint('hello") and len(text) > len(lab.cells[0] + typed), text
        events = httpx.get(f"{lab.base}/mlx/v1/events", params={"stream": 0, "since": since}, timeout=30,
                           trust_env=False, headers={"Authorization": f"Bearer {key}"}).json()
        assert any(e["kind"] == "insert" and e["detail"].get("source") == "completer" for e in events)
        assert not errors, errors


def test_inline_completion_fills_the_hole_for_a_model_with_fim_tokens(tmp_path, page):
    """For a model whose tokenizer has FIM tokens, the completer sends the code after the cursor
    too: the engine reads the hole's prompt (its token count is the code before and after plus the
    three FIM tokens, one token a byte), and Tab puts the suggestion between them."""
    from fim_fixture import fim_model
    from playwright.sync_api import expect

    extension_installed()
    model = fim_model(tmp_path / "fim-llama", "starcoder")
    before, after = "def area(r):\n    return ", "\n\nprint(area(2.0))"
    (tmp_path / "lab").mkdir()
    with Lab(tmp_path / "lab", [before + after], model=str(model)) as lab, \
            watched(page, lab, "labext-99-fim-failure") as errors:
        notebook, _ = open_notebook(lab, page)
        expect(page.locator(".mlx-nb-StatusItem")).to_contain_text("ready", timeout=WAIT_S * MS)  # status read
        editor = notebook.locator(".jp-Cell").first.locator(".cm-content")
        editor.click()
        page.keyboard.press("Control+Home")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("End")  # after "return "
        page.keyboard.type("r", delay=30)
        ghost = page.locator(".jp-GhostText")
        try:
            expect(ghost).to_have_count(1, timeout=20 * MS)
        except AssertionError:
            page.keyboard.press("Alt+\\\\")
            expect(ghost).to_have_count(1, timeout=WAIT_S * MS)
        _shot(page, "labext-light-04-fill-in-the-middle")
        page.keyboard.press("Tab")
        text = cell_text(page, editor, len(before + "r" + after))  # accepted into the cell
        assert text.startswith(before + "r") and text.endswith(after.strip("\n")), text
        key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
        events = httpx.get(f"{lab.base}/mlx/v1/events", params={"stream": 0}, timeout=30, trust_env=False,
                           headers={"Authorization": f"Bearer {key}"}).json()
        asked = [e["detail"].get("prompt_tokens") for e in events
                 if e["kind"] == "insert" and e["detail"].get("source") == "completer"]
        assert len((before + "r").encode()) + len(after.encode()) + 3 in asked, asked
        assert not errors, errors


PNG_JS = """(b64) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], 'picture.png', {type: 'image/png'}));
  return transfer;
}"""


def test_sidebar_chat_takes_a_dropped_image_to_a_vision_model(tmp_path, page):
    """An image dropped on the chat box goes with the next question (a thumbnail shows with it):
    the vision model reads it with the question, and the answer streams in."""
    import base64
    import io

    from playwright.sync_api import expect

    from mlx_nb.compat.vision_check import picture

    extension_installed()
    buf = io.BytesIO()
    picture(56, 42, 7).save(buf, format="PNG")
    with Lab(tmp_path, ["1 + 1"], model="tiny-qwen2-vl") as lab, watched(page, lab, "labext-99-image-failure") as errors:
        page.goto(f"{lab.base}/lab?token={lab.token}", wait_until="domcontentloaded", timeout=60 * MS)
        item = page.locator(".mlx-nb-StatusItem")
        expect(item).to_contain_text("tiny-qwen2-vl · ready", timeout=WAIT_S * MS)
        item.click()
        box = page.locator("#mlx-nb-sidebar .mlx-nb-Chat")
        field = box.locator(".mlx-nb-Chat-input")
        answers = box.locator(".mlx-nb-Chat-assistant")
        transfer = page.evaluate_handle(PNG_JS, base64.b64encode(buf.getvalue()).decode())
        field.dispatch_event("drop", {"dataTransfer": transfer})
        expect(box.locator(".mlx-nb-Chat-attached .mlx-nb-Chat-thumb")).to_have_count(1, timeout=10 * MS)
        field.fill("Describe it.")
        field.press("Enter")
        expect(answers.nth(0)).to_have_attribute("data-finish", re.compile("^(stop|length)$"), timeout=WAIT_S * MS)
        expect(box.locator(".mlx-nb-Chat-user").nth(0).locator("img.mlx-nb-Chat-thumb")).to_have_count(1)
        expect(box.locator(".mlx-nb-Chat-attached .mlx-nb-Chat-thumb")).to_have_count(0)  # it went with the question
        _shot(page, "labext-light-04-chat-image")
        key = (lab.root / "runtime" / "mlx-nb-api-key").read_text().strip()
        events = httpx.get(f"{lab.base}/mlx/v1/events", params={"stream": 0}, timeout=30, trust_env=False,
                           headers={"Authorization": f"Bearer {key}"}).json()
        inserts = [e["detail"] for e in events if e["kind"] == "insert" and e["detail"].get("source") == "Lab sidebar chat"]
        assert [d["images"] for d in inserts] == [1], inserts  # the engine read the image with the question
        assert not errors, errors
