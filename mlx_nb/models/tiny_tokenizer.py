"""A byte-level tokenizer for the tiny random fixtures, built offline with `tokenizers`.

Every byte is one token (no merges), then the chat/vision special tokens. Real enough to go
through the same loading, templating and streaming-detokenizer path as a real model.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
]
VOCAB_SIZE = 288  # 256 bytes + specials, padded to a multiple of 16


def special_id(token: str, extra: tuple = ()) -> int:
    """The id of a special token: the shared ones first, then a fixture's `extra` ones."""
    return 256 + [*SPECIAL_TOKENS, *extra].index(token)


def write_tokenizer(dest: Path, chat_template: str, extra_config: dict | None = None, extra: tuple = ()) -> None:
    """tokenizer.json + tokenizer_config.json; `extra` special tokens (a vision family's image
    markers) get the ids after the shared ones."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [*SPECIAL_TOKENS, *extra]])
    tok.save(str(dest / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": chat_template,
        **(extra_config or {}),
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _byte_of(ch: str) -> int:
    # ByteLevel maps printable bytes to themselves and the rest to U+0100 onwards, in byte order.
    table = _byte_table()
    return table[ch]


_TABLE: dict[str, int] = {}


def _byte_table() -> dict[str, int]:
    if not _TABLE:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
            range(ord("®"), ord("ÿ") + 1)
        )
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _TABLE.update({chr(c): b for b, c in zip(bs, cs)})
    return _TABLE
