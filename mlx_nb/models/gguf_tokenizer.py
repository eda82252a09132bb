"""A Hugging Face fast tokenizer rebuilt from GGUF metadata (byte-level BPE or SentencePiece)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from mlx_nb.models.gguf_meta import GGUFError
from mlx_nb.models.gguf_meta import corrupt as _corrupt
from mlx_nb.models.gguf_meta import meta as _meta

# How each `tokenizer.ggml.pre` splits text before byte-level BPE, as in the original tokenizer.json.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PRE = {name: _LLAMA3_SPLIT for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3")}
_DIGITS_PRE = {"smollm"}
_GPT2_PRE = {None, "default", "gpt2", "gpt-2"}

_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4


def write_tokenizer(out: Path, src: Path, meta: dict, max_length: int) -> dict:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; returns the generation ids."""
    kind = _meta(src, meta, "tokenizer.ggml.model", None)
    tokens = [str(t) for t in _meta(src, meta, "tokenizer.ggml.tokens")]
    types = _meta(src, meta, "tokenizer.ggml.token_type", None) or [1] * len(tokens)
    if len(types) != len(tokens):
        raise _corrupt(src, f"{len(tokens)} tokens but {len(types)} token types")

    def token_id(key: str) -> int | None:
        value = _meta(src, meta, f"tokenizer.ggml.{key}", None)
        if value is None:
            return None
        if not 0 <= int(value) < len(tokens):
            raise _corrupt(src, f"tokenizer.ggml.{key} {value} is outside the vocabulary")
        return int(value)

    ids = {name: token_id(f"{name}_token_id") for name in ("bos", "eos", "padding", "unknown", "eot", "eom")}
    add_bos = bool(_meta(src, meta, "tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(_meta(src, meta, "tokenizer.ggml.add_eos_token", False))
    if kind == "gpt2":
        tok = _byte_level_bpe(src, meta, tokens)
    elif kind == "llama":
        tok = _sentencepiece(src, meta, tokens, types, ids)
    else:
        raise GGUFError(
            f"{src} uses a {kind!r} tokenizer; only byte-level BPE ('gpt2') and SentencePiece ('llama') "
            "tokenizers can be converted: pass another file"
        )
    _add_special_tokens(tok, tokens, types, ids)
    _set_post_processor(tok, tokens, ids, add_bos, add_eos)
    _check_tokenizer(src, tok, tokens, types)
    tok.save(str(out / "tokenizer.json"))

    names = {"bos_token": "bos", "eos_token": "eos", "pad_token": "padding", "unk_token": "unknown"}
    special = {k: tokens[ids[v]] for k, v in names.items() if ids[v] is not None}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    chat_template = _meta(src, meta, "tokenizer.chat_template", None)
    if chat_template:
        tokenizer_config["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False))

    stops = list(dict.fromkeys(i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None))
    return {
        "bos_token_id": ids["bos"],
        "eos_token_id": (stops[0] if len(stops) == 1 else stops) if stops else None,
        "pad_token_id": ids["padding"],
    }


def _byte_level_bpe(src: Path, meta: dict, tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    merges = _meta(src, meta, "tokenizer.ggml.merges", None)
    if merges is None:
        raise GGUFError(f"{src} has a byte-level BPE tokenizer without merges: pass another file")
    pre = _meta(src, meta, "tokenizer.ggml.pre", None)
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_PRE:
        pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in _SPLIT_PRE:
        pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        if pre not in _GPT2_PRE:
            warnings.warn(
                f"{src.name}: unknown tokenizer pre-tokenizer {pre!r}; splitting text like GPT-2, "
                "so some tokenizations may differ from llama.cpp",
                RuntimeWarning,
                stacklevel=4,
            )
        pre_tokenizer = byte_level
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=pre in _SPLIT_PRE))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(src: Path, meta: dict, tokens: list[str], types: list[int], ids: dict):
    """SentencePiece (Llama 2, Mistral, TinyLlama...) through transformers' own GGUF tokenizer builder."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer,
        )
    except ImportError as exc:
        raise GGUFError(
            f"{src} has a SentencePiece tokenizer, which needs transformers>=5 with GGUF support: "
            "upgrade transformers"
        ) from exc
    tokenizer_dict = {
        "tokenizer_type": "llama",
        "pre_tokenizer_type": _meta(src, meta, "tokenizer.ggml.pre", None),
        "tokens": tokens,
        "token_type": types,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "unk_token_id": ids["unknown"],
        "pad_token_id": ids["padding"],
    }
    for key, name in (("scores", "scores"), ("merges", "merges"), ("add_space_prefix", "add_prefix_space")):
        value = _meta(src, meta, f"tokenizer.ggml.{key}", None)
        if value is not None:
            tokenizer_dict[name] = value
    if "scores" not in tokenizer_dict and "merges" not in tokenizer_dict:
        raise GGUFError(f"{src} has a SentencePiece tokenizer without scores or merges: pass another file")
    try:
        tok, _ = convert_gguf_tokenizer("llama", tokenizer_dict)
    except Exception as exc:
        raise GGUFError(f"{src}: could not rebuild its SentencePiece tokenizer ({exc}): pass another file") from exc
    return tok


def _add_special_tokens(tok, tokens: list[str], types: list[int], ids: dict) -> None:
    from tokenizers import AddedToken

    named = {i for i in ids.values() if i is not None}
    special = [i for i, t in enumerate(types) if t == _TOKEN_CONTROL or i in named]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    user = [tokens[i] for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED and i not in named]
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


def _set_post_processor(tok, tokens: list[str], ids: dict, add_bos: bool, add_eos: bool) -> None:
    from tokenizers import processors

    bos = tokens[ids["bos"]] if add_bos and ids["bos"] is not None else None
    eos = tokens[ids["eos"]] if add_eos and ids["eos"] is not None else None
    if bos is None and eos is None:
        tok.post_processor = None
        return
    pre, post = ([bos] if bos else []), ([eos] if eos else [])
    specials = [(t, ids[k]) for t, k in ((bos, "bos"), (eos, "eos")) if t is not None]
    tok.post_processor = processors.TemplateProcessing(
        single=" ".join([*pre, "$A", *post]),
        pair=" ".join([*pre, "$A", *post, *pre, "$B:1", *post]),
        special_tokens=list(dict.fromkeys(specials)),
    )


def _check_tokenizer(src: Path, tok, tokens: list[str], types: list[int]) -> None:
    probe = "Hello, world! 12345"
    if tok.decode(tok.encode(probe, add_special_tokens=False).ids, skip_special_tokens=False) != probe:
        raise GGUFError(
            f"{src}: the rebuilt tokenizer does not round-trip text (unsupported vocabulary): pass another file"
        )
    for i, t in enumerate(types):
        if t == _TOKEN_CONTROL and tok.encode(tokens[i], add_special_tokens=False).ids != [i]:
            raise GGUFError(f"{src}: special token {tokens[i]!r} does not map to its id {i}: pass another file")
