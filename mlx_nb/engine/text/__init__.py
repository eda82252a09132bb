"""Tokens made into text: the UTF-8-safe detokenizing stream and a thinking model's reasoning kept
apart from its answer (and what the logits processors know of it)."""
