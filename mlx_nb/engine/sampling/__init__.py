"""Choosing each next token: per-request samplers and logits processors, and constrained decoding
(JSON schemas, regexes, grammars, tool calls)."""
