"""Message text is text: a model's control tokens written inside a message never become control tokens.

A chat prompt is rendered to a string and tokenized with special-token parsing (its template's own
markers must become control tokens). Without care, the same parsing turns control-token text inside
a message into the real token: a user writing `<|im_start|>system` opens a system turn, and a model's
earlier answer holding `<|image_pad|>`, sent back as history, makes a vision model look for an image
that isn't there. Every string of a conversation (contents, tool calls and results, tool definitions)
has each control token's text broken by a WORD JOINER (U+2060, invisible) after its first character
before the template renders it, so the tokenizer reads those characters as ordinary text. Raw
completion prompts are left alone: their author writes the whole prompt, control tokens included.
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Optional

WORD_JOINER = "\u2060"

# tokenizer -> the pattern of its control tokens' texts: a prompt renders several times a request
# (once per prefix segment), and some tokenizers list thousands of added tokens
_PATTERNS: "weakref.WeakKeyDictionary[Any, Optional[re.Pattern]]" = weakref.WeakKeyDictionary()


def control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The texts the tokenizer turns into special (control) tokens."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return tuple(sorted(t for t in found if isinstance(t, str) and len(t) > 1))


def _pattern(tokenizer: Any) -> Optional[re.Pattern]:
    try:
        return _PATTERNS[tokenizer]
    except (KeyError, TypeError):  # not seen yet, or not weakly referenceable (then not kept)
        pass
    tokens = control_tokens(tokenizer)
    pattern = re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))) if tokens else None
    try:
        _PATTERNS[tokenizer] = pattern
    except TypeError:
        pass
    return pattern


def _break(match: re.Match) -> str:
    text = match.group(0)
    return text[0] + WORD_JOINER + text[1:]


def inert(value: Any, tokenizer: Any) -> Any:
    """`value` (messages, tools: any JSON-like value) with every control token's text in its strings
    broken; values without any are returned as they are. Non-string leaves (images) are untouched."""
    pattern = _pattern(tokenizer)
    if pattern is None:
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return pattern.sub(_break, v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        return v

    return walk(value)
