"""Constrained decoding: one request's output held to a JSON schema, a regex or a Lark grammar, row
by row in the shared batch.

Built on llguidance (a dependency of mlx-vlm already): its matcher walks the tokenizer's token trie
lazily for each step, so a grammar needs no compiling against the vocabulary up front (xgrammar's
does, per schema) and a row's mask costs well under a millisecond a step (bench/results/
structured.md). That makes the constraint an ordinary per-request logits processor: every row of
the batch follows its own grammar (or none), the free rows' logits are never touched, and a
grammar that reaches a dead end fails its own request only.

A constraint is compiled and validated on the caller's thread at submit, so a schema llguidance
cannot compile is a one-line 400 naming the reason, never an engine error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from mlx_nb.engine.types import RequestError

KINDS = ("json_schema", "regex", "lark", "gbnf", "tool_call")
DIGITS_MAX = 16  # a JSON number's digits in a row, as llama.cpp's JSON grammars bound them (see JsonDigits)


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match: a JSON schema (a dict), a regex, a grammar (Lark, as
    llguidance and vLLM take it, or GBNF as llama.cpp takes it), or a tool call (`tool_call`:
    {"functions": [(name, parameters schema)], "markers": (start, end)}: one call in the model's
    markers, its name one of the functions and its arguments that function's schema)."""

    kind: str
    value: Any
    field: str = "constraint"  # the request field it came from, for error messages

    def grammar(self, tokenizer: Any = None) -> str:
        """llguidance's grammar; `tokenizer` (mlx_lm's) names a tool call's special-token markers."""
        from llguidance import LLMatcher
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            if self.kind == "tool_call":
                return LLMatcher.grammar_from_lark(_tool_call_lark(self.value, tokenizer))
            if self.kind == "json_schema":
                return LLMatcher.grammar_from_json_schema(self.value, defaults={"whitespace_flexible": False})
            if self.kind == "regex":
                return LLMatcher.grammar_from_regex(self.value)
            if self.kind == "gbnf":
                return LLMatcher.grammar_from_lark(gbnf_to_lark(self.value))
            if self.kind == "lark":
                return LLMatcher.grammar_from_lark(self.value)
        except Exception as exc:  # llguidance says why in its message
            raise RequestError(f"{self.field}: cannot compile it: {_line(exc)}", self.field) from None
        raise RequestError(f"{self.field}: unknown constraint kind {self.kind!r} (one of {', '.join(KINDS)})",
                           self.field)


def _per_model(loaded, name: str, make) -> Any:
    """`make()` once per loaded model, kept with the model it reads."""
    if getattr(loaded, name, None) is None:
        setattr(loaded, name, make())
    return getattr(loaded, name)


def llg_tokenizer(loaded) -> Any:
    """llguidance's view of the model's tokenizer, made once per loaded model (its stop tokens are
    the engine's, so a finished grammar ends the request as a stop token does)."""

    def make():
        import llguidance.hf

        hf = getattr(loaded.tokenizer, "_tokenizer", loaded.tokenizer)
        eos = sorted(getattr(loaded.tokenizer, "eos_token_ids", None) or []) or None
        try:
            return llguidance.hf.from_tokenizer(hf, n_vocab=loaded.vocab_size, eos_token=eos)
        except Exception as exc:
            raise RequestError(f"constrained decoding is not available for {loaded.name}: its tokenizer cannot be "
                               f"read by llguidance ({_line(exc)})", "response_format") from None

    return _per_model(loaded, "_llg_tokenizer", make)


def processor_for(loaded, constraint: Constraint) -> "GrammarProcessor":
    """A fresh per-request processor for `constraint`; a grammar llguidance rejects is a RequestError."""
    from llguidance import LLMatcher

    tokenizer = llg_tokenizer(loaded)
    grammar = constraint.grammar(loaded.tokenizer)
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if failed:
        raise RequestError(f"{constraint.field}: cannot compile it: {_line('; '.join(messages))}", constraint.field)
    digits = JsonDigits(loaded) if constraint.kind in ("json_schema", "tool_call") else None
    return GrammarProcessor(tokenizer, grammar, digits)


class JsonDigits:
    """Bounds a JSON number's run of digits, where the grammar allows it to end.

    JSON's grammar lets a number run on forever, and a small model sampling at temperature 1 can
    keep writing digits until its budget is gone (seen with SmolLM2: 1 of 50 schemas). llama.cpp's
    JSON grammars allow at most 16 digits in a row; here, once a number (outside a string) has
    DIGITS_MAX digits in a row, tokens starting with a digit are masked out, but only when the
    grammar still allows something else, so no output that the schema allows is made impossible
    except numbers of more than 16 digits in a row."""

    def __init__(self, loaded):
        self.decode = loaded.tokenizer.decode
        self.starts_with_digit = _digit_tokens(loaded)
        self.in_string = self.escaped = False
        self.run = 0

    def feed(self, token: int) -> None:
        for ch in self.decode([token]):
            if self.in_string:
                self.in_string = self.escaped or ch != '"'
                self.escaped = not self.escaped and ch == "\\"
            else:
                self.in_string = ch == '"'
                self.run = self.run + 1 if ch.isdigit() else 0

    def cap(self, allowed):
        """`allowed` (a 0/1 array over the vocabulary) without digit tokens, when the run is at its
        bound and something else is allowed."""
        if self.run < DIGITS_MAX:
            return allowed
        width = min(allowed.size, self.starts_with_digit.size)
        capped = allowed.copy()
        capped[:width] &= ~self.starts_with_digit[:width]
        return capped if capped.any() else allowed


def _digit_tokens(loaded):
    """Per token id: whether its text starts with a digit (once per model)."""

    def make():
        import numpy as np

        decode = loaded.tokenizer.decode
        return np.array([decode([i])[:1].isdigit() for i in range(loaded.vocab_size or 0)], dtype=np.uint8)

    return _per_model(loaded, "_digit_tokens", make)


class GrammarProcessor:
    """A logits processor for one request's row: it advances the request's matcher by the tokens
    generated since its last call, then lets through only the tokens the grammar allows next.

    Called as BatchGenerator and generate_step call processors: `(tokens so far, logits (1, V))`,
    the first time with the prompt alone."""

    def __init__(self, tokenizer, grammar: str, digits: Optional[JsonDigits] = None):
        import llguidance.numpy
        from llguidance import LLMatcher

        self.matcher = LLMatcher(tokenizer, grammar)
        self.digits = digits
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
        self.start: Optional[int] = None  # the prompt's length: tokens after it are the output
        self.consumed = 0  # output tokens the matcher has seen

    def __call__(self, tokens, logits):
        import llguidance.numpy
        import mlx.core as mx
        import numpy as np

        if self.start is None:
            self.start = len(tokens)
        seen = self.start + self.consumed
        new = np.asarray(tokens[seen:]).tolist() if len(tokens) > seen else []
        if new:
            self.matcher.consume_tokens(new)
            self.consumed += len(new)
        if self.digits is not None:
            for t in new:
                self.digits.feed(t)
        if self.matcher.is_error():
            raise ValueError(f"the output can no longer match its grammar: {self.matcher.get_error()}")
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        allowed = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")
        width = logits.shape[-1]
        allowed = allowed[:width] if allowed.size >= width else np.pad(allowed, (0, width - allowed.size))
        if self.digits is not None:
            allowed = self.digits.cap(allowed)
        if not allowed.any():
            raise ValueError("the grammar allows no next token (a dead end)")
        return mx.where(mx.array(allowed.astype(bool)), logits, mx.array(-float("inf"), dtype=logits.dtype))


def tool_call(functions: list[tuple[str, Optional[dict]]], markers: tuple[str, str]) -> Constraint:
    """A reply that is one call of one of `functions` ((name, parameters schema)), in `markers`."""
    return Constraint("tool_call", {"functions": [(n, p or {"type": "object"}) for n, p in functions],
                                    "markers": tuple(markers)}, "tool_choice")


def _tool_call_lark(value: dict, tokenizer: Any) -> str:
    """start marker, the call as JSON ({"name": one of the functions, "arguments": its schema}),
    end marker; a marker that is one token of the vocabulary is named by id (a special token is
    not spelled out by text)."""
    calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": params},
              "required": ["name", "arguments"], "additionalProperties": False}
             for name, params in value["functions"]]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": {"whitespace_flexible": False}}
    start, end = (_marker(m, tokenizer) for m in value["markers"])
    return f'start: {start} "\\n"? call "\\n"? {end}\ncall: %json {json.dumps(schema)}'


def _marker(text: str, tokenizer: Any) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False) if tokenizer is not None else []
    return f"<[{ids[0]}]>" if len(ids) == 1 else json.dumps(text)


SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")


def closed(schema: Any) -> Any:
    """The schema with every object that does not say otherwise closed to its listed properties:
    OpenAI's `strict: true` requires `additionalProperties: false` on every object, and pydantic's
    schemas (the openai SDK's `parse`) leave it out, which would let a model invent keys."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(sub) for sub in out[key]]
    for key in SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _line(what: Any) -> str:
    """One line of at most 300 characters: llguidance's messages span several (a caret under the spot)."""
    text = " ".join(str(what).split())
    return (text or type(what).__name__)[:300]
