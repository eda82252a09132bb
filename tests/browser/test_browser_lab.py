"""End to end in a real browser: JupyterLab serving the default model, driven by headless chromium.

A `jupyter lab` process on loopback loads the real default model (smollm2-135m-instruct) into its
one shared engine; the kernel it starts inherits MLX_NB_URL / MLX_NB_TOKEN, so the notebook's
`%%mlx chat`, ChatPanel, BatchVisualizer and CacheInspector talk to that engine over HTTP.
Playwright drives Debian's chromium (Playwright's own browser download needs the network): open the
notebook, Run All Cells, then read what the page RENDERED, in the light theme and then the dark
one: the chat answer ("Paris") and its footer; a ChatPanel at 800 px that keeps its controls in
view, sends on Enter and not on leaving the box, and copies its reply; the live cache of a request
decoding on the server (non-zero bytes); re-running a cell leaving one live visualizer; every
widget's text in a colour that stands out from its background; and a saved tutorial opened
untrusted showing its pictures. Screenshots (the test's artifacts) land in test-output/browser/,
which git ignores.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_server import MS, NOTEBOOK, WAIT_S, Lab, _dismiss_dialogs, _requirements, _shot, menu, run_all_cells
from page_checks import COLOURS_JS, OVERFLOW_JS, weakest_contrast

from mlx_nb.pictures.theme import svg_of

pytestmark = pytest.mark.browser

PANEL_QUESTION = "Name a primary color."

CELLS = [
    "%load_ext mlx_nb",
    "%%mlx chat\nWhat is the capital of France?",
    "from mlx_nb.widgets import ChatPanel\npanel = ChatPanel()\npanel",
    "from mlx_nb import Client\nfrom mlx_nb.widgets import BatchVisualizer, CacheInspector\n"
    "client = Client()\nviz = BatchVisualizer(client)\nviz",
    "st = client.stream('Tell me a long story about the sea.', max_tokens=300)\nnext(st)\n"
    "inspector = CacheInspector(client, auto_refresh=True)\ninspector",
    "import threading\nprint(sorted(t.name for t in threading.enumerate() if t.name.startswith('mlx-nb')))",
]
TUTORIAL = "03-hybrid-caches.ipynb"  # a saved tutorial, opened untrusted: its pictures must show


@pytest.fixture
def lab(tmp_path):
    _requirements()
    tutorial = Path(__file__).resolve().parents[2] / "notebooks" / TUTORIAL
    with Lab(tmp_path, CELLS, files=(tutorial,)) as server:
        yield server


def _run_cell(page, cell) -> None:
    """Select a cell and run it in place (Ctrl+Enter), as a user re-runs one cell."""
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")


def _bytes_shown(svg_texts: list[str]) -> list[float]:
    """The byte counts an mlx-cache picture prints ("19.2 KiB each", "0 B")."""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    found = [re.match(r"^([\d.]+) (B|KiB|MiB|GiB)( each)?$", t.strip()) for t in svg_texts]
    return [float(m.group(1)) * units[m.group(2)] for m in found if m]


def _check_contrast(page, notebook, theme: str) -> None:
    """Every widget's text must stand out from what is behind it (WCAG ratio >= 3)."""
    texts = {
        "batch timeline": notebook.locator("svg.mlx-batch text"),
        "cache picture": notebook.locator("svg.mlx-cache text"),
        "ChatPanel bubble": notebook.locator(".widget-vbox .widget-html span"),
        "ChatPanel reply": notebook.locator(".widget-output .jp-RenderedMarkdown p"),
        "chat answer": notebook.locator(".jp-Cell").nth(1).locator(".jp-RenderedMarkdown p"),
        "chat footer": notebook.locator(".mlx-nb-footer"),
    }
    for name, locator in texts.items():
        assert locator.count(), f"{theme}: no {name} on the page"
        worst, where = weakest_contrast(locator)
        print(f"{theme}: {name}: weakest contrast {worst:.1f} ({where})")
        assert worst >= 3.0, f"{theme}: {name} text hardly differs from its background: {where}"


def _check_panel_at_800(page, panel) -> str:
    """At 800 px the panel's rows fit, its buttons are in view; Enter sends, leaving the box does not."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 800, "height": 1000})
    page.keyboard.press("Control+b")  # the file browser closed: the notebook gets the window's width
    page.wait_for_timeout(500)
    panel.scroll_into_view_if_needed()
    print(f"ChatPanel width at an 800 px window: {panel.bounding_box()['width']:.0f} px")
    overflowing = panel.evaluate(OVERFLOW_JS)
    assert overflowing == [], f"ChatPanel rows overflow at 800 px: {overflowing}"
    box = panel.bounding_box()
    for name in ("Send", "Stop", "Clear"):
        b = panel.get_by_role("button", name=name).bounding_box()
        assert b and box["x"] <= b["x"] and b["x"] + b["width"] <= box["x"] + box["width"] + 1, name
    bubbles = panel.locator(".widget-html span")
    before = bubbles.count()
    question = panel.locator("input[placeholder='Ask something, Enter to send']")
    question.click()
    question.fill(PANEL_QUESTION)
    panel.locator(".widget-label").first.click()  # leave the box: nothing is sent
    page.wait_for_timeout(1500)
    assert bubbles.count() == before and question.input_value() == PANEL_QUESTION
    question.press("Enter")
    expect(panel).to_contain_text(PANEL_QUESTION)
    # the final counts: "N tokens · R tok/s · S s · stop|max tokens"
    counts = panel.locator(".widget-label", has_text=re.compile(r"^\d+ tokens? · .* · (stop|max tokens)$"))
    expect(counts).to_have_count(1, timeout=WAIT_S * MS)
    reply = panel.locator(".widget-output .jp-RenderedMarkdown").last.inner_text().strip()
    assert reply and "▌" not in reply and not reply.startswith("mlx:"), reply
    assert overflowing == panel.evaluate(OVERFLOW_JS)  # still nothing clipped with the reply in
    _shot(page, "light-03-panel-800px")
    page.keyboard.press("Control+b")
    return reply


def test_lab_light_and_dark(lab, page):
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    page.set_default_timeout(30 * MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{lab.base}/lab/tree/{NOTEBOOK}?token={lab.token}", wait_until="domcontentloaded",
                  timeout=60 * MS)
        notebook = page.locator(".jp-NotebookPanel").first
        cells = notebook.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(len(CELLS), timeout=60 * MS)
        _dismiss_dialogs(page)
        idle = notebook.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        expect(idle).to_have_count(1, timeout=WAIT_S * MS)

        run_all_cells(page, notebook)

        # %%mlx chat: the streamed Markdown answer names Paris; a footer follows it
        chat_out = cells.nth(1).locator(".jp-OutputArea-output")
        expect(chat_out.first).to_contain_text("Paris", timeout=WAIT_S * MS)
        expect(cells.nth(1).locator(".mlx-nb-footer")).to_contain_text(
            re.compile(r"smollm2-135m-instruct · \d+ tokens · .* s"), timeout=WAIT_S * MS)
        stderr = cells.nth(1).locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        assert stderr.count() == 0, stderr.all_inner_texts()

        # the ChatPanel widget rendered (its view, not the text/plain fallback)
        panel = cells.nth(2).locator(".jp-OutputArea-output .widget-vbox").first
        expect(panel.locator("input[placeholder='Ask something, Enter to send']")).to_be_visible(
            timeout=WAIT_S * MS)
        expect(panel).to_contain_text("smollm2-135m-instruct")  # the model label from the server

        # the cache of the request decoding on the server, followed live: non-zero bytes
        cache_svg = cells.nth(4).locator("svg.mlx-cache")
        expect(cells.nth(4).locator(".widget-label", has_text=re.compile(r"^following req-"))).to_have_count(
            1, timeout=WAIT_S * MS)
        assert max(_bytes_shown(cache_svg.locator("text").all_text_contents())) > 0
        expect(cache_svg.locator("g.grid")).not_to_have_count(0)
        expect(idle).to_have_count(1, timeout=WAIT_S * MS)
        _shot(page, "light-01-ran-all")

        reply = _check_panel_at_800(page, panel)
        page.set_viewport_size({"width": 1400, "height": 1000})
        panel.locator("button.mlx-copy").click()
        expect(panel.locator("button.mlx-copy")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()").strip() == reply

        # the batch timeline holds lanes named by prompt, from this notebook
        batch_svg = cells.nth(3).locator("svg.mlx-batch")
        _run_cell(page, cells.nth(3))  # re-run: the old visualizer must stop, not linger
        expect(batch_svg.locator("g.lane").first).to_be_visible(timeout=WAIT_S * MS)
        threads = cells.nth(5).locator(".jp-OutputArea-output")
        for _ in range(3):  # the old ones stop at once; a second look allows for the kernel's scheduling
            _run_cell(page, cells.nth(5))
            expect(threads).to_contain_text("mlx-nb-batch-visualizer", timeout=WAIT_S * MS)
            names = threads.inner_text()
            if names.count("mlx-nb-batch-visualizer") == 1 and names.count("mlx-nb-events") == 1:
                break
            page.wait_for_timeout(1000)
        assert names.count("mlx-nb-batch-visualizer") == 1 and names.count("mlx-nb-events") == 1, names
        _check_contrast(page, notebook, "light")
        _shot(page, "light-02-widgets")

        menu(page, "Settings", "Theme", "JupyterLab Dark")  # live, as a user switches it
        expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1, timeout=60 * MS)
        page.wait_for_timeout(1000)  # the theme's stylesheet applied
        expect(notebook.locator("svg.mlx-batch g.lane").first).to_be_visible(timeout=WAIT_S * MS)
        expect(notebook.locator("svg.mlx-cache g.grid").first).to_be_visible(timeout=WAIT_S * MS)
        _check_contrast(page, notebook, "dark")
        _shot(page, "dark-01-widgets")

        # a saved tutorial, opened as anyone who cloned the repository would: untrusted
        page.goto(f"{lab.base}/lab/tree/{TUTORIAL}?token={lab.token}", wait_until="domcontentloaded")
        _dismiss_dialogs(page)
        # the tutorial's own panel: the first notebook's stays in the page, hidden, and comes after
        # it in the page's order about as often as before (seen once: the hidden one picked)
        tutorial = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)", has_text="Hybrid caches: what batching does")
        expect(tutorial).to_have_count(1, timeout=60 * MS)
        pictures = tutorial.locator(".jp-OutputArea-output .mlx-nb-static img")
        tutorial.locator(".jp-Cell").first.click()
        scroller = tutorial.locator(".jp-WindowedPanel-outer").first
        for _ in range(60):  # Lab renders only the cells in view: scroll down to the pictures
            if pictures.count() >= 2:
                break
            # the notebook's own scroller, moved directly: a wheel event lands wherever the mouse is,
            # and one sent while the page still lays itself out can be lost (seen once: never scrolled)
            scroller.evaluate("el => el.scrollBy(0, 600)")
            page.wait_for_timeout(250)
        expect(pictures.first).to_be_visible(timeout=10 * MS)
        pictures.nth(1).scroll_into_view_if_needed()
        assert pictures.nth(1).evaluate("img => img.complete && img.naturalWidth") > 0  # it decoded and drew
        svg = svg_of(f'src="{pictures.nth(1).get_attribute("src")}"')[0]
        assert 'class="mlx-cache"' in svg and 'class="grid"' in svg and 'class="pad"' in svg
        fg, bg, alpha, _ = pictures.nth(1).evaluate_all(COLOURS_JS)[0]
        assert bg == "rgb(255, 255, 255)" and "var(--jp-ui-font-color1, #222)" in svg  # dark text on its white card
        _shot(page, "dark-02-untrusted-tutorial")
    except Exception:
        try:
            _shot(page, "99-failure")
        except PlaywrightError as exc:
            print(f"no failure screenshot: {exc}")
        print(f"page errors: {errors}\n--- lab.log ---\n{lab.log_tail()}")
        raise
