"""Fill-in-the-middle prompts: the code before and after the cursor, for models trained to fill a hole.

A code model trained with FIM reads the text before a hole and after it, each marked by its
tokenizer's FIM tokens, and writes what goes between. The known spellings are tried in turn, each
needing its three markers as single tokens of the vocabulary. A model with none of them cannot take
a suffix: the completions route says so, and the Lab's completer (which reads `status()`) then
continues the code before the cursor instead.
"""

from __future__ import annotations

from typing import Any, Optional

from mlx_nb.engine.inputs.prompts import encode_prompt

# name -> (before, after, hole) markers, read in prefix-suffix-middle order
FORMATS = {
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "deepseek": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
}


def _single_token(tokenizer: Any, text: str) -> bool:
    try:
        token_id = tokenizer.convert_tokens_to_ids(text)
    except Exception:  # a tokenizer without the lookup: no FIM
        return False
    unknown = getattr(tokenizer, "unk_token_id", None)
    return isinstance(token_id, int) and token_id != unknown and tokenizer.convert_ids_to_tokens(token_id) == text


def fim_format(tokenizer: Any) -> Optional[str]:
    """The name of the FIM spelling this tokenizer has (see FORMATS), or None."""
    for name, markers in FORMATS.items():
        if all(_single_token(tokenizer, m) for m in markers):
            return name
    return None


def fim_prompt(tokenizer: Any, before: str, after: str) -> list[int]:
    """Token ids asking the model for what goes between `before` and `after` (the tokenizer's BOS
    first where it adds one). Raises ValueError if the tokenizer has no FIM tokens."""
    name = fim_format(tokenizer)
    if name is None:
        raise ValueError("this tokenizer has no fill-in-the-middle tokens")
    prefix, suffix, hole = FORMATS[name]
    return encode_prompt(tokenizer, f"{prefix}{before}{suffix}{after}{hole}", chat=False)
