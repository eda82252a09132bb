"""GGUF files in the shapes people run, made here for the bench: random weights written in the real
layouts (Llama-3.2-1B, Qwen2.5-3B), quantized by llama.cpp's own `llama-quantize`; and the default
model's real weights re-quantized to Q4_K_M for the quality check.

    .venv/bin/python bench/real_models.py          # makes (or finds) every file, prints their paths

The files are cached under $MLX_NB_HOME/bench (about 10 GB while the float16 sources exist; they
are removed once quantized). Needs llama.cpp's tools (see servers.llama_tool): a bench dependency,
never the test suite's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

# The published shapes (their config.json), with a vocabulary of the real size.
SHAPES = {
    "llama-3.2-1b": dict(arch="llama", hidden=2048, layers=16, heads=32, kv=8, head_dim=64, ffn=8192,
                         vocab=128256, rope_theta=500000.0, llama3_rope=True, bias=False),
    "qwen2.5-3b": dict(arch="qwen2", hidden=2048, layers=36, heads=16, kv=2, head_dim=128, ffn=11008,
                       vocab=151936, rope_theta=1000000.0, llama3_rope=False, bias=True),
}


def bench_dir() -> Path:
    from mlx_nb.models.sources import home

    path = home() / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _smollm2_tokenizer() -> dict:
    """The default model's tokenizer metadata (a byte-level BPE), as the vocabulary to pad."""
    from mlx_nb.models.gguf_read import read
    from mlx_nb.models.sources import _smollm2_gguf

    meta, _ = read(_smollm2_gguf())
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def _write_f16(name: str, dest: Path) -> None:
    import gguf

    from mlx_nb.models.gguf import llama3_rope_factors

    s = SHAPES[name]
    tok = _smollm2_tokenizer()
    tokens = list(tok["tokenizer.ggml.tokens"])
    types = list(tok["tokenizer.ggml.token_type"])
    pad = s["vocab"] - len(tokens)
    # ordinary tokens (" w123"): a random model picks them often, and both servers must stream them as text
    tokens += [f"Ġw{i}" for i in range(pad)]
    types += [1] * pad
    rng = np.random.default_rng(0)
    tmp = dest.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), s["arch"])
    w.add_name(name)
    w.add_block_count(s["layers"])
    w.add_context_length(32768 if s["arch"] == "qwen2" else 131072)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-5 if s["arch"] == "llama" else 1e-6)
    w.add_rope_freq_base(s["rope_theta"])
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok.get("tokenizer.ggml.pre", "smollm"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(tok["tokenizer.ggml.merges"]))
    w.add_bos_token_id(int(tok["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(tok["tokenizer.ggml.eos_token_id"]))
    w.add_chat_template(tok["tokenizer.chat_template"])

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv"] * s["head_dim"]
    w.add_tensor("token_embd.weight", mat(s["vocab"], h))  # tied: the output layer is the embedding
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    if s["llama3_rope"]:
        scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        w.add_tensor("rope_freqs.weight", np.array(llama3_rope_factors(scaling, s["head_dim"], s["rope_theta"]),
                                                   np.float32))
    for i in range(s["layers"]):
        for part, shape in (("attn_q", (q, h)), ("attn_k", (kv, h)), ("attn_v", (kv, h)), ("attn_output", (h, q)),
                            ("ffn_gate", (s["ffn"], h)), ("ffn_up", (s["ffn"], h)), ("ffn_down", (h, s["ffn"]))):
            w.add_tensor(f"blk.{i}.{part}.weight", mat(*shape))
            if s["bias"] and part in ("attn_q", "attn_k", "attn_v"):
                w.add_tensor(f"blk.{i}.{part}.bias", (rng.standard_normal(shape[0]) * 0.02).astype(np.float32))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(dest)


def quantize(src: Path, dest: Path, kind: str, *extra: str) -> Path:
    """llama.cpp's llama-quantize SRC DEST KIND (written to a temporary name, then renamed)."""
    from servers import llama_tool

    if dest.exists():
        return dest
    tool = llama_tool("llama-quantize")
    if tool is None:
        raise SystemExit("llama-quantize not found: set LLAMA_CPP_BIN to the folder of llama.cpp's tools")
    tmp = dest.with_suffix(".tmp")
    subprocess.run([tool, *extra, str(src), str(tmp), kind], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                   env={**os.environ, "LD_LIBRARY_PATH": str(Path(tool).parent)})
    tmp.rename(dest)
    return dest


def shaped(name: str, kind: str = "Q4_K_M") -> Path:
    """A GGUF of `name`'s shape quantized to `kind` (random weights), made once."""
    dest = bench_dir() / f"{name}-{kind}.gguf"
    if dest.exists():
        return dest
    f16 = bench_dir() / f"{name}-F16.gguf"
    if not f16.exists():
        print(f"writing {f16.name}", flush=True)
        _write_f16(name, f16)
    print(f"quantizing to {dest.name}", flush=True)
    quantize(f16, dest, kind)
    f16.unlink()
    return dest


def default_requantized(kind: str = "Q4_K_M") -> Path:
    """The default model's real weights (its Q4_1 file) re-quantized to `kind` by llama-quantize:
    its 576-wide rows are not a multiple of 256, so most tensors fall back to other block types."""
    from mlx_nb.models.sources import _smollm2_gguf

    return quantize(_smollm2_gguf(), bench_dir() / f"smollm2-135m-{kind}.gguf", kind, "--allow-requantize")


if __name__ == "__main__":
    import mlx_nb  # noqa: F401

    for name in SHAPES:
        print(shaped(name))
    print(default_requantized())
