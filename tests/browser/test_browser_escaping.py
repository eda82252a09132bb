"""In a real browser, hostile model output renders as text and nothing in it runs.

A `jupyter lab` process (tiny model) and headless chromium, as in test_browser_lab. The notebook's
kernel runs a tiny-llama Engine whose replies are forced (tests/forcing.py) to contain
`<img src=x onerror=...>`, `<script>`, a `javascript:` link and a code block, and shows them
through `%%mlx chat` (the live display, then `Out[n]`) and a ChatPanel; another cell shows the whole
generated hostile corpus through `markdown_bundle`. Every payload would set `window.__pwned`.
A control cell shows one payload WITHOUT escaping: it must run (setting `window.__control`), which
proves this JupyterLab runs HTML in outputs and that the test would see it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hostile_text import CONTEXTS, PAYLOADS
from lab_server import MS, WAIT_S, Lab, _requirements, _shot, open_notebook, run_all_cells, watched

pytestmark = pytest.mark.browser

TESTS = Path(__file__).resolve().parents[1]
HOSTILE = ("Sure! <img src=x onerror=\"window.__pwned='img'\"> and <script>window.__pwned='script'</script>\n\n"
           "```html\n<b>code stays code</b>\n```\n\n[click](javascript:window.__pwned='link') *done*")
CORPUS_N = 40  # random nestings on top of every payload in every context

CELLS = [
    "\n".join([
        "import sys",
        f"sys.path.insert(0, {str(TESTS)!r})",
        "from IPython.display import display",
        "from forcing import ForcedEngine",
        "from hostile_text import hostile_corpus",
        "from mlx_nb import Client, Engine",
        "from mlx_nb.safe_markdown import markdown_bundle",
        "from mlx_nb.widgets import ChatPanel",
        f"forced = Client(engine=ForcedEngine(Engine('tiny-llama', wait=True), {HOSTILE!r}))",
        "%load_ext mlx_nb",
        "get_ipython().magics_manager.registry['MlxMagics']._client = forced",
    ]),
    "%%mlx chat\nsay it",
    "Out[2]",
    "panel = ChatPanel(forced)\npanel.send('say it')\npanel",
    f"corpus = hostile_corpus({CORPUS_N})\nfor text in corpus:\n    display(markdown_bundle(text), raw=True)",
    "display({'text/markdown': '<img src=x onerror=\"window.__control=1\">'}, raw=True)  # control: unescaped",
]


@pytest.fixture
def lab(tmp_path):
    _requirements()
    with Lab(tmp_path, cells=CELLS, model="tiny-llama") as server:
        yield server


def _check_rendered_as_text(output) -> None:
    from playwright.sync_api import expect

    expect(output).to_contain_text("<img src=x onerror=\"window.__pwned='img'\">")
    expect(output).to_contain_text("<script>window.__pwned='script'</script>")
    expect(output).to_contain_text("[click](javascript:window.__pwned='link')")
    expect(output.locator("pre code")).to_have_text(re.compile(r"^\s*<b>code stays code</b>\s*$"))
    expect(output.locator("em")).to_have_text("done")  # Markdown still renders
    assert output.locator("img, script, b, a").count() == 0


def test_hostile_replies_render_as_text_and_nothing_runs(lab, page):
    from playwright.sync_api import expect

    with watched(page, lab, "escaping-99-failure") as errors:
        notebook, idle = open_notebook(lab, page)
        run_all_cells(page, notebook)
        cells = notebook.locator(".jp-Notebook .jp-Cell")
        control = cells.nth(5).locator(".jp-OutputArea-output")
        expect(control).to_have_count(1, timeout=WAIT_S * MS)  # the last cell ran
        expect(idle).to_have_count(1, timeout=WAIT_S * MS)
        panel = cells.nth(3).locator(".jp-OutputArea-output .widget-vbox").first
        expect(panel.locator(".widget-label", has_text=re.compile(r"tokens? · .* · stop$"))).to_have_count(
            1, timeout=WAIT_S * MS)
        _shot(page, "escaping-ran-all")

        _check_rendered_as_text(cells.nth(1).locator(".jp-OutputArea .jp-RenderedMarkdown").first)
        _check_rendered_as_text(cells.nth(2).locator(".jp-OutputArea .jp-RenderedMarkdown").first)
        _check_rendered_as_text(panel.locator(".widget-output .jp-RenderedMarkdown").last)

        cells.nth(4).get_by_role("button", name="Show more outputs").click()  # Lab shows 50 at first
        corpus = cells.nth(4).locator(".jp-OutputArea .jp-RenderedMarkdown")
        expect(corpus).to_have_count(len(PAYLOADS) * len(CONTEXTS) + CORPUS_N, timeout=WAIT_S * MS)
        dangerous = "img, script, iframe, svg, object, form, input, details, style, body, [onerror], [onload]"
        assert corpus.locator(dangerous).count() == 0
        hrefs = corpus.locator("a").evaluate_all("links => links.map(a => a.protocol)")
        assert set(hrefs) <= {"http:", "https:", "mailto:"}, set(hrefs)

        expect(control.locator("img")).to_have_count(1)
        page.wait_for_function("() => window.__control === 1", timeout=10 * MS)  # HTML in outputs does run
        assert page.evaluate("() => window.__pwned") is None
        assert not errors, errors
