"""Model text as Markdown that cannot carry HTML: the formatting renders, tags show as text.

Jupyter renders the `text/markdown` outputs of executed cells and of Output widgets as TRUSTED:
raw HTML in them runs (`<img onerror>`, `<script>`) with the page's credentials, which can start
kernels. Model text is untrusted (a pasted document, an image or a tool result can steer it), so
every place that shows it as Markdown shows `safe_markdown(text)` instead:

- outside code, every `<` becomes `&lt;`: no tag, comment or autolink can start;
- code spans and fenced code blocks become our own `<code>` / `<pre><code>` whose content has `&`,
  `<` and all other ASCII punctuation as character references: shown verbatim, and inert whether
  or not the renderer reads them as HTML;
- inside math (`$...$`, `$$...$$`, `\\begin{..}`, `\\(..\\)`, `\\[..\\]`) `<` becomes TeX's `\\lt `,
  so formulas still typeset;
- a link whose destination has a scheme other than http, https or mailto loses its link syntax
  (no clickable `javascript:`), and images become plain links (showing a reply fetches nothing).

Why hand-written: Markdown renderers (JupyterLab's marked, markdown-it, mistune) either keep raw
HTML or drop the formatting; none escapes HTML while keeping Markdown. Safety does not depend on
parsing Markdown the way the renderer does: whatever this module takes for code or prose, its
output holds no `<` but its own tags, and no link syntax before a bad scheme. A wrong guess costs
formatting, never safety.
"""

from __future__ import annotations

import html
import re

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")
# In what stays prose, nothing may open a fence: not a line whose info string held a backtick
# (its spans are gone now), nor one behind a quote or list marker (`> ```mermaid`).
_NOT_A_FENCE = re.compile(r"(?m)^((?:[ \t]*(?:>[ \t]?|[-*+][ \t]+|\d{1,9}[.)][ \t]+))*[ \t]*)([`~])(?=\2\2)")
# Code spans stay inside their block: a blank line, a new list item, quote, heading or table cell ends them.
_SPAN_BOUNDARY = re.compile(r"(\n[ \t]*\n|\n(?=[ \t]*(?:[-*+][ \t]|\d{1,9}[.)][ \t]|>|#{1,6}[ \t]|\|)))")
_TABLE_CELL = re.compile(r"((?<!\\)\|)")
_BACKTICKS = re.compile(r"(\\?)(`+)")
_MATH = re.compile(
    r"\$\$.+?\$\$|(?<![\\$])\$(?!\$)[^\n$]+?\$|\\begin\{([A-Za-z*]+)\}.*?\\end\{\1\}|\\\(.+?\\\)|\\\[.+?\\\]",
    re.S,
)
# `](` or `]:`, then (looked at, not consumed: the next link may start right after) the
# destination's start, up to what no scheme can hold.
_LINK_TARGET = re.compile(r"\]([(:])(?=[ \t]*\n?[ \t]*([^\s()\[\]]*))")
_SCHEME = re.compile(r"([a-z][a-z0-9+.\-]*):")
_ALLOWED_SCHEMES = {"http", "https", "mailto"}
_URL_IGNORED = re.compile(r"[\x00-\x20\x7f-\x9f<>]|\\(?=[!-/:-@\[-`{-~])")  # what browsers/renderers drop
_PUNCT = re.compile(r"[!-/:-@\[-`{-~]")


def safe_markdown(text: str) -> str:
    """`text` as Markdown whose rendering shows the text's HTML as text (see the module doc)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # Markdown's line endings, as the renderer sees them
    out, lines, i = [], text.split("\n"), 0
    prose: list[str] = []
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            prose.append(lines[i])
            i += 1
            continue
        end = _fence_end(lines, i + 1, m["fence"])
        if prose:
            out.append(_prose("\n".join(prose)))
            prose = []
        out.append(_pre(lines[i + 1:end], m["indent"]))
        i = end + 1
    if prose:
        out.append(_prose("\n".join(prose)))
    return "\n".join(out)


def markdown_bundle(text: str, reasoning: str = "", done: bool = False) -> dict:
    """A display bundle for model text: safe Markdown, and the raw text for plain frontends.

    A thinking model's `reasoning` is folded above the answer (a `<details>` of ours around the
    escaped reasoning): open while it is the part streaming (no answer yet and not `done`), closed
    once the answer comes or the reply ends."""
    bundle = {"text/markdown": safe_markdown(text), "text/plain": text}
    if not reasoning:
        return bundle
    opened = " open" if not text and not done else ""
    fold = (f"<details{opened} class='mlx-nb-thinking'><summary>Thinking</summary>\n\n"
            f"{safe_markdown(reasoning)}\n\n</details>\n\n")
    plain = f"Thinking:\n{reasoning}" + (f"\n\n{text}" if text else "")
    return {"text/markdown": fold + bundle["text/markdown"], "text/plain": plain}


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    """The closing fence's line (or one past the end: an open fence runs to the end)."""
    close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
    for j in range(start, len(lines)):
        if close.match(lines[j]):
            return j
    return len(lines)


def _inert(code: str) -> str:
    """Code as text no Markdown or HTML parser reads anything into."""
    return _PUNCT.sub(lambda m: f"&#{ord(m.group(0))};", code)


def _pre(body: list[str], indent: str) -> str:
    width = len(indent.expandtabs(4))
    lines = [_inert(line[min(width, len(line) - len(line.lstrip(" "))):]) for line in body]
    return f"{indent}<pre><code>" + "".join(line + "\n" for line in lines) + "</code></pre>"


def _prose(text: str) -> str:
    """Prose with its code spans made inert; the rest escaped (math and links, see the doc)."""
    out = []
    for block in _SPAN_BOUNDARY.split(text):
        row = block.lstrip(" \t").startswith("|")  # a table row: cells first, and `\|` is a `|` even in code
        for cell in _TABLE_CELL.split(block) if row else [block]:
            out.append(_code_and_text(cell, row))
    return _NOT_A_FENCE.sub(lambda m: m.group(1) + f"&#{ord(m.group(2))};", "".join(out))


def _code_and_text(block: str, row: bool) -> str:
    out, pos = [], 0
    for start, end, code in _code_spans(block):
        out.append(_text(block[pos:start]))
        code = code.replace("\\|", "|") if row else code
        out.append(f"<code>{_inert(code)}</code>")
        pos = end
    out.append(_text(block[pos:]))
    return "".join(out)


def _code_spans(block: str):
    """(start, end, content) of each CommonMark code span: a run of N backticks up to the next run
    of exactly N; a backslash-escaped run opens nothing (but closes: code has no escapes)."""
    runs = [(m.start(2), m.end(2), m.group(2), bool(m.group(1))) for m in _BACKTICKS.finditer(block)]
    i = 0
    while i < len(runs):
        start, end, run, escaped = runs[i]
        close = None if escaped else next((j for j in range(i + 1, len(runs)) if runs[j][2] == run), None)
        if close is None:
            i += 1
            continue
        content = block[end:runs[close][0]].replace("\n", " ")
        if len(content) > 2 and content[0] == content[-1] == " " and content.strip():
            content = content[1:-1]
        yield start, runs[close][1], content
        i = close + 1


def _text(text: str) -> str:
    pieces, pos = [], 0
    for m in _MATH.finditer(text):
        pieces.append(text[pos:m.start()].replace("<", "&lt;"))
        pieces.append(m.group(0).replace("<", r"\lt "))
        pos = m.end()
    pieces.append(text[pos:].replace("<", "&lt;"))
    return _defuse_links("".join(pieces).replace("![", "&#33;["))


def _defuse_links(text: str) -> str:
    """`](dest` and `]: dest` with a scheme other than http(s)/mailto lose the `(` / `:` that makes
    them a link; the text reads the same."""

    def check(m: re.Match) -> str:
        target = _URL_IGNORED.sub("", html.unescape(m.group(2))).lower()
        scheme = _SCHEME.match(target)
        if scheme is None or scheme.group(1) in _ALLOWED_SCHEMES:
            return m.group(0)
        return "]" + ("&#40;" if m.group(1) == "(" else "&#58;")

    return _LINK_TARGET.sub(check, text)
