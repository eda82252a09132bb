"""A thinking model in the Lab, in a real browser: `%%mlx chat`, a ChatPanel and the sidebar's chat
each show the reasoning as a folded "Thinking" part above the answer (closed once the reply has
ended, opened by a click), never as the answer's text; the fold's text stands out in the light and
the dark theme. The tiny Qwen3-style model's template opens `<think>` in the prompt, so its replies
start inside the reasoning. Screenshots land in test-output/browser/thinking-*.png."""

from __future__ import annotations

import re

import pytest
from lab_server import MS, WAIT_S, Lab, _shot, extension_installed, menu, open_notebook, run_all_cells, watched
from page_checks import weakest_contrast

from mlx_nb.models.fixture_teaching import ANSWER, REASONING

pytestmark = pytest.mark.browser

MODEL = "tiny-qwen3-think"
CELLS = [
    "%load_ext mlx_nb",
    "%%mlx chat -n 80\nWhat is two plus two?",
    "from mlx_nb.widgets import ChatPanel\npanel = ChatPanel(max_tokens=80)\npanel",
    "panel.send('And three plus three?')\nassert panel.wait(120)\nprint(repr(panel.replies[-1].reasoning[:20]))",
]


def check_fold(fold, theme: str) -> None:
    """A closed "Thinking" fold whose reasoning shows when opened, legible in `theme`."""
    from playwright.sync_api import expect

    expect(fold.locator("summary")).to_have_text("Thinking")
    if fold.get_attribute("open") is not None:
        fold.locator("summary").click()
    expect(fold).not_to_have_attribute("open", re.compile(".*"))
    fold.locator("summary").click()
    expect(fold).to_have_attribute("open", re.compile(".*"))
    assert fold.inner_text().removeprefix("Thinking").strip() == REASONING  # the fixture's taught reasoning
    worst, where = weakest_contrast(fold.locator("summary"))
    assert worst >= 3, f"{theme}: {where} ({worst:.2f})"


def test_the_reasoning_folds_above_the_answer_in_the_notebook_and_the_sidebar(tmp_path, page):
    from playwright.sync_api import expect

    extension_installed()
    with Lab(tmp_path, CELLS, model=MODEL) as lab, watched(page, lab, "thinking-99-failure") as errors:
        notebook, idle = open_notebook(lab, page)
        cells = notebook.locator(".jp-Notebook .jp-Cell")
        run_all_cells(page, notebook)
        expect(cells.nth(3).locator(".jp-OutputArea-output")).to_contain_text("'", timeout=WAIT_S * MS)
        expect(idle).to_have_count(1, timeout=WAIT_S * MS)

        magic_fold = cells.nth(1).locator("details.mlx-nb-thinking")
        expect(magic_fold).to_have_count(1, timeout=WAIT_S * MS)
        expect(cells.nth(1).locator(".mlx-nb-footer")).to_contain_text(MODEL)
        assert ANSWER in cells.nth(1).locator(".jp-RenderedMarkdown").inner_text()
        check_fold(magic_fold, "light")
        panel_fold = cells.nth(2).locator(".widget-output details.mlx-nb-thinking")
        expect(panel_fold).to_have_count(1)
        check_fold(panel_fold, "light")

        page.locator(".mlx-nb-StatusItem").click()
        box = page.locator("#mlx-nb-sidebar .mlx-nb-Chat")
        box.locator(".mlx-nb-Chat-input").fill("What is two plus two?")
        box.locator(".mlx-nb-Chat-input").press("Enter")
        answer = box.locator(".mlx-nb-Chat-assistant").first
        expect(answer).to_have_attribute("data-finish", re.compile("stop|length"), timeout=WAIT_S * MS)
        sidebar_fold = answer.locator("details.mlx-nb-Chat-thinking")
        expect(sidebar_fold).to_have_count(1)
        check_fold(sidebar_fold, "light")
        _shot(page, "thinking-light")

        menu(page, "Settings", "Theme", "JupyterLab Dark")
        expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1, timeout=60 * MS)
        for fold in (magic_fold, panel_fold, sidebar_fold):
            check_fold(fold, "dark")
        _shot(page, "thinking-dark")
        assert not errors, errors
