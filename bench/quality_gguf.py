"""Our kernels against llama.cpp on the same quantized file: the default model's real weights
re-quantized to Q4_K_M by llama-quantize (mostly K-quant and fallback blocks: its 576-wide rows are
not a multiple of 256).

    .venv/bin/python bench/quality_gguf.py    # writes bench/results/quality-gguf.md and .json

- perplexity on bench/data/quality_text.txt the way llama.cpp's `llama-perplexity` measures it
  (chunks of N_CTX tokens, each scoring its second half), ours and llama-perplexity's own, on the
  same file and text; for both activation precisions of ours (two int8 digits, the default for a
  model this small, and one, llama.cpp's);
- greedy replies to the 20 prompts of bench/quality.py, ours beside llama-server's.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

from quality import PROMPTS, TEXT  # noqa: E402

N_CTX = 512


def perplexity_llama_style(loaded, ids: list[int], n_ctx: int = N_CTX, bos: Optional[int] = None) -> tuple[float, int]:
    """llama-perplexity's measure, token for token: the text in chunks of n_ctx tokens, each read from
    scratch (its first token replaced by `bos` where the file's tokenizer adds one), the logits at
    positions n_ctx/2 .. n_ctx-2 scoring the tokens after them (n_ctx/2 - 1 per chunk). Returns
    (perplexity, tokens scored)."""
    import mlx.core as mx
    import mlx.nn as nn

    total, count = 0.0, 0
    first = n_ctx // 2
    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        chunk_ids = ids[start:start + n_ctx]
        if bos is not None:
            chunk_ids = [bos, *chunk_ids[1:]]
        chunk = mx.array(chunk_ids)[None]
        logits = loaded.model(chunk[:, :-1]).astype(mx.float32)
        loss = nn.losses.cross_entropy(logits[:, first:], chunk[:, first + 1:], reduction="sum")
        total += loss.item()
        count += n_ctx - 1 - first
    return math.exp(total / count), count


def bos_if_added(gguf: Path) -> Optional[int]:
    """The BOS id llama-perplexity puts first in every chunk, if the file's tokenizer adds one."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields

    def value(key):
        f = fields.get(key)
        return None if f is None else f.parts[f.data[0]][0]

    return int(value("tokenizer.ggml.bos_token_id")) if value("tokenizer.ggml.add_bos_token") else None


def llama_perplexity(gguf: Path, n_ctx: int = N_CTX, text: Path = TEXT, chunks: bool = False):
    """llama-perplexity's final estimate (and, with `chunks`, how many chunks it scored: the check
    that both sides read the same tokens). It tokenizes the text with special tokens *not* parsed
    (`<|im_start|>` is read as plain characters), so compare it on plain text only."""
    from servers import llama_tool

    exe = llama_tool("llama-perplexity")
    out = subprocess.run([exe, "-m", str(gguf), "-f", str(text), "-c", str(n_ctx), "-t", str(os.cpu_count()),
                          "-b", str(n_ctx)], capture_output=True, text=True, check=True,
                         env={**os.environ, "LD_LIBRARY_PATH": str(Path(exe).parent)})
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError("llama-perplexity printed no final estimate:\n" + (out.stdout + out.stderr)[-2000:])
    if not chunks:
        return float(found.group(1))
    count = re.search(r"perplexity over (\d+) chunks", out.stdout + out.stderr)
    return float(found.group(1)), int(count.group(1)) if count else None


def llama_replies(gguf: Path, max_tokens: int = 40) -> list[str]:
    import servers
    from openai import OpenAI

    with servers.llama_server(gguf, slots=1) as s:
        c = OpenAI(base_url=s.base_url, api_key="none")
        return [c.chat.completions.create(model=s.model, messages=[{"role": "user", "content": p}], temperature=0.0,
                                          max_tokens=max_tokens).choices[0].message.content for p in PROMPTS]


def main() -> None:
    import real_models
    from quality import continuations

    from mlx_nb.models import load_model

    gguf = real_models.default_requantized()
    text = TEXT.read_text()
    ours = {}
    for name, setting in (("int16", "int16"), ("int8", "int8")):
        os.environ["MLX_NB_ACTIVATIONS"] = setting
        loaded = load_model(str(gguf))
        ids = loaded.tokenizer.encode(text)
        ppl, scored = perplexity_llama_style(loaded, ids, bos=bos_if_added(gguf))
        ours[name] = {"perplexity": ppl, "tokens": len(ids), "scored": scored, "formats": loaded.weights["formats"],
                      "replies": continuations(loaded)}
        print(name, ppl, flush=True)
        del loaded
    os.environ.pop("MLX_NB_ACTIVATIONS")
    reference = llama_perplexity(gguf)
    replies = llama_replies(gguf)
    lines = ["# Quality: our kernels against llama.cpp on the same Q4_K_M file", "",
             f"`{gguf.name}`: the default model's weights re-quantized by llama-quantize to Q4_K_M, held as "
             + ", ".join(f"{k} x{n}" for k, n in ours["int8"]["formats"].items()) + ". "
             f"Perplexity on `bench/data/quality_text.txt` ({ours['int8']['tokens']} tokens) as llama-perplexity "
             f"measures it: chunks of {N_CTX}, the second half of each scored.", "",
             "| system | perplexity | vs llama.cpp |", "|---|---|---|",
             f"| llama.cpp `llama-perplexity` | {reference:.4f} | |"]
    for name, label in (("int16", "mlx-nb, two int8 digits of activations (the default at this size)"),
                        ("int8", "mlx-nb, one int8 digit (llama.cpp's; the default from 500M weights)")):
        r = ours[name]["perplexity"] / reference
        lines.append(f"| {label} | {ours[name]['perplexity']:.4f} | {(r - 1) * 100:+.2f}% |")
    same = {k: sum(a == b for a, b in zip(v["replies"], replies)) for k, v in ours.items()}
    lines += ["", f"Greedy replies identical to llama-server's: {same['int16']} of {len(PROMPTS)} (two digits), "
              f"{same['int8']} of {len(PROMPTS)} (one digit).", "", "## Greedy replies (40 tokens)", "",
              "| prompt | mlx-nb (two digits) | mlx-nb (one digit) | llama-server |", "|---|---|---|---|"]
    clean = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    for i, p in enumerate(PROMPTS):
        lines.append("| " + " | ".join(clean(c) for c in (p, ours["int16"]["replies"][i], ours["int8"]["replies"][i],
                                                           replies[i])) + " |")
    out = HERE / "results"
    (out / "quality-gguf.json").write_text(json.dumps({"ours": ours, "llama_perplexity": reference,
                                                       "llama_replies": replies}, indent=2))
    (out / "quality-gguf.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:10]))


if __name__ == "__main__":
    main()
