"""Model text reaches the notebook as Markdown that renders its HTML as text, formatting kept.

The escaped Markdown is rendered by two independent HTML-permitting Markdown renderers (markdown-it,
CommonMark's reference port, and mistune), and the HTML they produce is audited: no element,
attribute or link that could run or fetch. The reference for "formatting kept" is markdown-it with
raw HTML turned off, i.e. how CommonMark itself shows HTML as text. The same hostile text is then
forced through the tiny model into `%%mlx chat` (live, final, `Out[n]`) and ChatPanel.
"""

import random

import mistune
import pytest
from forcing import ForcedEngine
from hostile_text import PAYLOADS, audit_html, hostile_corpus
from ipython_shell import run_cell
from markdown_it import MarkdownIt

from mlx_nb.safe_markdown import markdown_bundle, safe_markdown



def _markdown_it_permissive():
    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    md.validateLink = lambda url: True  # JupyterLab's marked links any scheme: so must the reference
    return md.render


PERMISSIVE = {  # raw HTML and every link scheme rendered, as JupyterLab does for trusted outputs
    "markdown-it": _markdown_it_permissive(),
    "mistune": mistune.create_markdown(renderer=mistune.HTMLRenderer(escape=False, allow_harmful_protocols=True),
                                       plugins=["strikethrough", "table", "url"]),
}
HTML_AS_TEXT = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"]).render
CORPUS = hostile_corpus()
HTML_PAYLOADS = [p for p in PAYLOADS if p.startswith("<")]
PROSE_CONTEXTS = ["{p}", "Here: {p} and more *text*", "`code` then {p} then `more code`", "- item\n- {p}",
                  "> quoted {p}", "# Heading {p}", "**bold {p} bold**"]


def shown_text(html: str) -> str:
    return " ".join(audit_html(html)[1].split())


@pytest.mark.parametrize("renderer", sorted(PERMISSIVE))
def test_no_hostile_text_renders_anything_that_runs(renderer):
    render = PERMISSIVE[renderer]
    unsafe = {}
    for text in CORPUS:
        problems, _ = audit_html(render(safe_markdown(text)))
        if problems:
            unsafe[text] = problems
    assert len(CORPUS) > 1000 and not unsafe, list(unsafe.items())[:5]


def test_the_audit_catches_the_raw_text():
    """The control: unescaped, the same corpus is caught, every HTML payload in plain prose included."""
    render = PERMISSIVE["markdown-it"]
    # CommonMark reads neither as HTML (a browser-quirk tag, a `javascript:` autolink markdown-it refuses)
    quirks = {"<img/src=x/onerror=window.__pwned=1>", "<javascript:window.__pwned=1>"}
    for payload in set(HTML_PAYLOADS) - quirks:
        assert audit_html(render(payload))[0], payload
    caught = sum(1 for text in CORPUS if audit_html(render(text))[0])
    assert caught > len(CORPUS) // 3


@pytest.mark.parametrize("payload", HTML_PAYLOADS)
def test_html_shows_as_the_text_it_is(payload):
    for context in PROSE_CONTEXTS:
        text = context.format(p=payload)
        shown = shown_text(PERMISSIVE["markdown-it"](safe_markdown(text)))
        assert " ".join(payload.split()) in shown, (text, shown)
        assert shown == shown_text(HTML_AS_TEXT(text))


def test_links_with_other_schemes_are_text_and_images_are_links():
    md = safe_markdown("[ok](https://example.com) [mail](mailto:a@b.c) [rel](notes.md#x) "
                       "[bad](javascript:alert(1)) [sneaky](jav&#x09;ascript:alert(1)) ![pic](https://x.test/p.png)")
    html = PERMISSIVE["markdown-it"](md)
    assert 'href="https://example.com"' in html and 'href="mailto:a@b.c"' in html and 'href="notes.md#x"' in html
    assert "javascript" not in html.split("<a ")[-1].split(">")[0]
    assert "[bad](javascript:alert(1))" in shown_text(html) and "<img" not in html
    assert 'href="https://x.test/p.png">pic</a>' in html


def test_code_shows_verbatim():
    code = "if a < b && c > d:\n    print('<script>alert(1)</script>', `x`, *y*, [z](javascript:q))"
    for fence in ("```", "~~~", "````"):
        html = PERMISSIVE["markdown-it"](safe_markdown(f"Look:\n\n{fence}python\n{code}\n{fence}\n\nDone *now*."))
        assert audit_html(html)[0] == []
        assert audit_html(html.split("<pre><code>")[1].split("</code></pre>")[0])[1] == code + "\n"
        assert "<em>now</em>" in html
    span = PERMISSIVE["markdown-it"](safe_markdown("run `a <b> && c` then ``x ` <i>y</i>``"))
    assert "<code>a &lt;b&gt; &amp;&amp; c</code>" in span and "<code>x ` &lt;i&gt;y&lt;/i&gt;</code>" in span


def test_math_keeps_less_than_as_tex():
    assert safe_markdown("so $a<b$ and $$\\sum_{i<n} x_i$$") == "so $a\\lt b$ and $$\\sum_{i\\lt n} x_i$$"


def _benign_document(rng: random.Random) -> str:
    words = ["a<b", "x & y", "if (a < b) {}", "<div>", "3 > 2", "*star*", "__u__", "[x]", "a_b", "tom's",
             "#include <stdio.h>", "a | b", "&amp;", "`tick`"]

    def inline() -> str:
        w = rng.choice(words)
        return rng.choice([w.replace("<", "lt"), "*em*", "**strong**", f"`{w}`", "~~gone~~",
                           f"[site](https://example.com/{rng.randrange(9)})", f"``a ` {w}``"])

    def line() -> str:
        return " ".join(inline() for _ in range(rng.randint(1, 4)))

    def block() -> str:
        kind = rng.randrange(7)
        if kind == 0:
            return "#" * rng.randint(1, 3) + " " + line()
        if kind == 1:
            return "\n".join(rng.choice("-*+") + " " + line() for _ in range(rng.randint(1, 3)))
        if kind == 2:
            return "\n".join(f"{i + 1}. " + line() for i in range(rng.randint(1, 3)))
        if kind == 3:
            fence = rng.choice(["```", "~~~", "````"])
            body = "\n".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
            return f"{fence}{rng.choice(['', 'python', ' c'])}\n{body}\n{fence}"
        if kind == 4:
            return "> " + line()
        if kind == 5:
            cell = lambda: inline().replace("|", "\\|")  # noqa: E731
            return f"| h1 | h2 |\n|---|---|\n| {cell()} | {cell()} |"
        return line()

    return "\n\n".join(block() for _ in range(rng.randint(1, 5)))


def _shape(html: str) -> tuple[list[str], str]:
    from html.parser import HTMLParser

    class Shape(HTMLParser):
        tags: list = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

        def handle_endtag(self, tag):
            self.tags.append("/" + tag)

    shape = Shape()
    shape.tags = []
    shape.feed(html)
    return shape.tags, shown_text(html)


def test_formatting_is_kept():
    """Generated documents (headings, lists, quotes, tables, emphasis, links, code with `<` in it):
    the escaped Markdown renders to the same elements and text as CommonMark with HTML as text."""
    rng = random.Random(7)
    for _ in range(300):
        doc = _benign_document(rng)
        assert _shape(PERMISSIVE["markdown-it"](safe_markdown(doc))) == _shape(HTML_AS_TEXT(doc)), doc


def test_plain_markdown_is_unchanged():
    doc = "# Title\n\n- one *two* **three**\n- [four](https://example.com)\n\n> five\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    assert safe_markdown(doc) == doc


def test_bundle_keeps_the_raw_text_for_plain_frontends():
    text = "<b>hi</b>"
    assert markdown_bundle(text) == {"text/markdown": "&lt;b>hi&lt;/b>", "text/plain": text}


# -- through the real model, Client, magics and ChatPanel ----------------------------------------------
HOSTILE = ("Sure! <img src=x onerror=\"window.__pwned='img'\"> and <script>window.__pwned='script'</script>\n\n"
           "```html\n<b>code stays code</b>\n```\n[click](javascript:window.__pwned=1) *done*")


@pytest.fixture(scope="module")
def forced():
    from mlx_nb import Engine

    with Engine("tiny-llama", wait=True) as engine:
        yield ForcedEngine(engine, HOSTILE)


@pytest.fixture
def shell(tmp_path_factory, forced, monkeypatch):
    import os

    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from mlx_nb import Client

    os.environ.setdefault("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=cfg)
    ip.run_line_magic("load_ext", "mlx_nb")
    magics = ip.magics_manager.registry["MlxMagics"]
    monkeypatch.setattr(magics, "_client", Client(engine=forced))
    monkeypatch.delenv("MLX_NB_NO_STREAM", raising=False)
    magics.conversation.clear()
    return ip


_run = run_cell


def _assert_escaped(data: dict) -> None:
    assert data["text/plain"] == HOSTILE and data["text/markdown"] == safe_markdown(HOSTILE)
    problems, shown = audit_html(PERMISSIVE["markdown-it"](data["text/markdown"]))
    assert problems == [] and "<script>window.__pwned='script'</script>" in shown


def test_chat_magic_escapes_live_final_and_later_displays(shell, monkeypatch):
    answer, cap = _run(shell, "%%mlx chat\nsay it")
    assert str(answer) == HOSTILE  # the model really said it
    # the answer's display (a waiting line, then Markdown updates), and our footer after it
    updates = [o.data for o in cap.outputs if "text/markdown" in o.data]
    assert len(updates) >= 1 and all("<img" not in d["text/markdown"] for d in updates)
    rendered = [v for o in cap.outputs for k, v in o.data.items() if k != "text/plain"]
    assert rendered and all("<img" not in v for v in rendered)  # nor the waiting line or the footer
    _assert_escaped(updates[-1])

    monkeypatch.setenv("MLX_NB_NO_STREAM", "1")
    answer, cap = _run(shell, "%%mlx chat\nagain")
    (final,) = [o for o in cap.outputs if "text/markdown" in o.data]
    _assert_escaped(final.data)

    later, cap = _run(shell, f"Out[{shell.execution_count - 1}]")
    assert later is answer
    (shown,) = cap.outputs
    _assert_escaped(shown.data)


def test_chat_panel_escapes_replies_and_errors(forced):
    from mlx_nb import Client
    from mlx_nb.widgets import ChatPanel

    panel = ChatPanel(Client(engine=forced))
    panel.send("say it")
    assert panel.wait(60) and panel.replies[-1].text == HOSTILE
    (output,) = panel.transcript.children[-1].outputs
    _assert_escaped(output["data"])

    bubble = panel.transcript.children[-2].value  # the user's own bubble was always escaped
    assert "say it" in bubble and "<img" not in bubble

    panel.send("look", images=["<img src=x onerror=1>.png"])  # an error that quotes what it was given
    assert panel.wait(60)
    (output,) = panel.transcript.children[-1].outputs
    problems, shown = audit_html(PERMISSIVE["markdown-it"](output["data"]["text/markdown"]))
    assert problems == [] and "image not found: <img src=x onerror=1>.png" in shown


def test_cache_drawing_escapes_what_a_server_sends():
    """CacheInspector draws a layout that may come from any server it is pointed at (W.HTML: raw HTML)."""
    import xml.etree.ElementTree as ET

    from mlx_nb.pictures.cache import build_cache_svg

    hostile = '"><img src=x onerror="window.__pwned=1">'
    layout = {"model": hostile, "request": hostile, "layers": [
        {"layer": hostile, "type": hostile, "offset": hostile, "shapes": [[1, 2]], "dtype": hostile, "nbytes": 8}]}
    svg = build_cache_svg(layout)
    root = ET.fromstring(svg)  # well-formed: nothing broke out of an attribute or a text node
    assert {el.tag.split("}")[-1] for el in root.iter()} <= {"svg", "g", "rect", "text", "title"}
    assert not any(name.startswith("on") for el in root.iter() for name in el.attrib)
