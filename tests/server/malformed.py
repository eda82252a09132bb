"""Malformed request bodies for chat, completions and messages, generated from one valid body per
route: broken JSON, wrong-kind values at every field, lone surrogates in every string (values and
keys), huge values, bad image parts, unknown blocks and nested junk. Every case is a mistake a
client can make; none is a valid request by accident (values are drawn from kinds the field does
not accept)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Iterator

MODEL = "tiny-qwen3-vl"  # a vision model: image parts get past "text-only" into decoding
VALID = {
    "chat": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0.0,
             "stop": ["x"]},
    "completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0.0, "stop": "x"},
    "messages": {"model": MODEL, "max_tokens": 2, "system": "be brief", "stop_sequences": ["x"],
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
}
HUGE_BYTES = 2**20  # the fuzz server's max_body_bytes
PATHS = {"chat": "chat/completions", "completions": "completions", "messages": "messages"}

# The JSON kinds each field accepts: a replacement is drawn from the other kinds.
ACCEPTS = {
    "model": {"str"}, "messages": {"list"}, "max_tokens": {"int"}, "temperature": {"int", "float"},
    "stop": {"str", "list"}, "prompt": {"str", "list"}, "system": {"str", "list"}, "stop_sequences": {"list"},
    "role": {"str"}, "content": {"str", "list"}, "type": {"str"}, "text": {"str"},
}
JUNK = {
    "none": [None], "bool": [True, False], "int": [-7, 10**30], "float": [1.5, -1e308],
    "str": ["", "zzz", "\x00"], "list": [[], [None], [[[]]], [{}]], "dict": [{}, {"a": {"b": [1]}}],
}
SURROGATES = ["\ud800", "\udfff", "a\udc00b", "\udbff\ud800"]
BAD_JSON = [
    b"", b"{", b"}", b'{"model": }', b'{"messages": [}', b"{'single': 'quotes'}", b'{"a": 1,}', b"null",
    b"[]", b"1", b'"text"', b"NaN", b'{"max_tokens": NaN}', b'{"max_tokens": Infinity}', b"\xff\xfe{}",
    b'{"messages": "\xc3\x28"}', b'{"a": "\\ud800"', b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b'{"max_tokens": 1' + b"0" * 5000 + b"}",
]
BAD_IMAGE_PARTS = [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!not-base64!!!"}},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8gd29ybGQ="}},
    {"type": "image_url", "image_url": {"url": "data:text/html;base64,PHNjcmlwdD4="}},
    {"type": "image_url", "image_url": {"url": 5}},
    {"type": "image_url", "image_url": {}},
    {"type": "image_url", "image_url": {"url": "/etc/passwd"}},
    {"type": "image_url", "image_url": {"url": "../../secret.png"}},
    {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
    {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}},
    {"type": "image_url", "image_url": {"url": "gopher://x/1"}},
    {"type": "image_url", "image_url": {"url": "\ud800.png"}},
]
BAD_ANTHROPIC_IMAGES = [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!!"}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}},
    {"type": "image", "source": {"type": "base64", "media_type": "text/html", "data": "PHNjcmlwdD4="}},
    {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:1/x.png"}},
    {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}},
    {"type": "image", "source": {"type": "bogus"}},
    {"type": "image", "source": "not an object"},
    {"type": "image"},
]
UNKNOWN_BLOCKS = [
    {"type": "video", "video": "x"}, {"type": 5}, {"text": "no type"}, {"type": None}, {"type": ["text"]},
    {"type": "text"}, {"type": "text", "text": 5}, {"type": "tool_result"}, {"type": "tool_use", "input": 3},
]


def _kind(v: Any) -> str:
    if v is None:
        return "none"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}[type(v)]


def _paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path to a value in `obj` (dict keys and list indexes)."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj: Any, path: tuple, value: Any) -> Any:
    obj = copy.deepcopy(obj)
    target = obj
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return obj


def _get(obj: Any, path: tuple) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def _content_parts(route: str, parts: list) -> dict:
    body = copy.deepcopy(VALID[route])
    body["messages"] = [{"role": "user", "content": parts}]
    return body


def _huge(route: str) -> list[dict]:
    base = VALID[route]
    # (A max_tokens past the context is clamped, not refused, and any model name is accepted while one
    # model is served, as the APIs' clients expect: those are not malformed.)
    cases = [{**base, "temperature": 1e308}, {**base, "max_tokens": -1}, {**base, "max_tokens": 0},
             {**base, "temperature": -1e308}]
    text_field = "prompt" if route == "completions" else "messages"
    if route == "completions":
        cases.append({**base, "prompt": [[10**9, -5]]})  # token ids no vocabulary has
    else:
        cases.append({**base, "messages": [{"role": "user", "content": "x"}] * 3 + [{"role": "nobody",
                                                                                    "content": "x"}]})
    cases.append({**base, text_field: None})
    cases.append({**base, "stop": ["s" * 1000] * 1000} if route != "messages" else {**base, "stop_sequences": 5})
    cases.append({**base, "max_tokens": 2, "padding": "p" * HUGE_BYTES})  # past the body limit: 413
    return cases


def malformed_requests(seed: int = 16, per_kind: int = 4) -> list[tuple[str, str, bytes]]:
    """(route, what is wrong, body bytes), for every route."""
    rng = random.Random(seed)
    out: list[tuple[str, str, bytes]] = []

    def add(route: str, why: str, body: Any) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # ensure_ascii: surrogates survive
        out.append((route, why, raw))

    for route, base in VALID.items():
        for raw in BAD_JSON:
            add(route, f"bad JSON {raw[:20]!r}", raw)
        paths = [p for p in _paths(base) if p and isinstance(p[-1], str) and p[-1] in ACCEPTS]
        for path in paths:  # wrong kinds at every known field
            kinds = [k for k in JUNK if k not in ACCEPTS[path[-1]] and not (k == "none" and path[-1] in (
                "stop", "system", "temperature", "model", "stop_sequences", "max_tokens"))]  # null means "unset" there
            for kind in rng.sample(kinds, min(per_kind, len(kinds))):
                add(route, f"{'.'.join(map(str, path))} as {kind}", _set(base, path, rng.choice(JUNK[kind])))
        for path in [p for p in _paths(base) if p and isinstance(_get(base, p), str)]:  # bad unicode in every string
            add(route, f"lone surrogate in {'.'.join(map(str, path))}", _set(base, path, rng.choice(SURROGATES)))
        for key in list(base):  # ... and in keys
            add(route, f"lone surrogate in key {key}", {**{k: v for k, v in base.items() if k != key},
                                                        key + "\ud800": base[key]})
        add(route, "lone surrogate as an extra key", {**base, "\udc80": 1})
        for body in _huge(route):
            add(route, "huge or out-of-range value", body)
        if route == "chat":
            for part in BAD_IMAGE_PARTS:
                add(route, f"bad image part {json.dumps(part)[:60]}", _content_parts(route, [
                    {"type": "text", "text": "look"}, part]))
        if route == "messages":
            for block in BAD_ANTHROPIC_IMAGES:
                add(route, f"bad image block {json.dumps(block)[:60]}", _content_parts(route, [block]))
        if route != "completions":
            for block in UNKNOWN_BLOCKS:
                add(route, f"unknown block {json.dumps(block)[:60]}", _content_parts(route, [block]))
            for junk in ([[[]]], [[None]], {"0": {"role": "user"}}, [{"role": "user", "content": {"nested": [[]]}}],
                         [{"role": "user", "content": [[{"type": "text", "text": "x"}]]}]):
                add(route, f"nested junk messages {json.dumps(junk)[:40]}", {**base, "messages": junk})
    return out
