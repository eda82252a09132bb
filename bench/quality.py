"""What the kernels do to the default model's output, against the same weights run in float32.

    .venv/bin/python bench/quality.py    # writes bench/results/quality.md and quality.json

- perplexity on bench/data/quality_text.txt (an original text of ~3,400 tokens), in windows of
  1,024 tokens, with the kernels (4/8-bit weights as shipped, two-digit int8 activations) and with
  the weights dequantized to float32 (this project's CPU path before the kernels);
- greedy continuations of 20 prompts, side by side, and llama.cpp's llama-server on the same GGUF
  when it is on PATH or $LLAMA_SERVER (its Q8 activations are one int8 digit).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

TEXT = HERE / "data" / "quality_text.txt"
WINDOW = 1024
PROMPTS = [
    "What is the capital of France?", "Name three primary colors.", "What is 12 times 12?",
    "Write a haiku about the sea.", "Explain photosynthesis in one sentence.", "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.", "What is the boiling point of water in Celsius?",
    "Translate 'good morning' into Spanish.", "List two planets larger than Earth.",
    "What does a thermometer measure?", "Suggest a name for a pet cat.", "How many days are in a leap year?",
    "What is the opposite of cold?", "Describe a bicycle in one sentence.", "What language is spoken in Brazil?",
    "Write one sentence about autumn.", "What is the largest ocean on Earth?", "Why do we need sleep?",
    "What is 15 minus 7?",
]


def perplexity(loaded, ids: list[int]) -> float:
    import mlx.core as mx
    import mlx.nn as nn

    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, WINDOW):
        window = mx.array(ids[start:start + WINDOW + 1])[None]
        if window.shape[1] < 2:
            break
        logits = loaded.model(window[:, :-1]).astype(mx.float32)
        loss = nn.losses.cross_entropy(logits, window[:, 1:], reduction="sum")
        total += loss.item()
        count += window.shape[1] - 1
    return math.exp(total / count)


def continuations(loaded, max_tokens: int = 40) -> list[str]:
    from mlx_nb.compat.reference import reply_tokens
    from mlx_nb.engine import encode_prompt, render_chat

    out = []
    for p in PROMPTS:
        ids = encode_prompt(loaded.tokenizer, render_chat(loaded.tokenizer, [{"role": "user", "content": p}]), chat=True)
        out.append(loaded.tokenizer.decode(reply_tokens(loaded, ids, max_tokens)))
    return out


def llama_continuations(max_tokens: int = 40) -> list[str] | None:
    import servers
    from openai import OpenAI

    from mlx_nb.models.sources import _smollm2_gguf

    if servers.llama_server_binary() is None:
        return None
    with servers.llama_server(_smollm2_gguf(), slots=1) as s:
        c = OpenAI(base_url=s.base_url, api_key="none")
        return [c.chat.completions.create(model=s.model, messages=[{"role": "user", "content": p}], temperature=0.0,
                                          max_tokens=max_tokens).choices[0].message.content for p in PROMPTS]


def main() -> None:
    from mlx_nb.models import load_model

    text = TEXT.read_text()
    results = {}
    for policy in ("kernels", "float32"):
        os.environ["MLX_NB_DTYPE"] = policy
        loaded = load_model("smollm2-135m-instruct")
        ids = loaded.tokenizer.encode(text)
        results[policy] = {"perplexity": perplexity(loaded, ids), "tokens": len(ids), "replies": continuations(loaded)}
        print(policy, results[policy]["perplexity"], flush=True)
        del loaded
    os.environ.pop("MLX_NB_DTYPE")
    llama = llama_continuations()
    ratio = results["kernels"]["perplexity"] / results["float32"]["perplexity"]
    same = sum(a == b for a, b in zip(results["kernels"]["replies"], results["float32"]["replies"]))
    lines = ["# Quality: the kernels against float32", "",
             f"Default model (SmolLM2-135M-Instruct, the Q4_1 GGUF's weights), {results['kernels']['tokens']} tokens of "
             f"`bench/data/quality_text.txt` in windows of {WINDOW}.", "",
             "| path | perplexity |", "|---|---|",
             f"| kernels (4/8-bit weights, two-digit int8 activations) | {results['kernels']['perplexity']:.3f} |",
             f"| float32 (the same weights dequantized) | {results['float32']['perplexity']:.3f} |", "",
             f"Ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f}%). Greedy replies identical to float32: {same} of {len(PROMPTS)}.",
             "", "## Greedy replies (40 tokens)", ""]
    head = "| prompt | kernels | float32 |" + (" llama.cpp llama-server |" if llama else "")
    lines += [head, "|---|---|---|" + ("---|" if llama else "")]
    clean = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    for i, p in enumerate(PROMPTS):
        row = [p, results["kernels"]["replies"][i], results["float32"]["replies"][i]] + ([llama[i]] if llama else [])
        lines.append("| " + " | ".join(clean(c) for c in row) + " |")
    out = HERE / "results"
    (out / "quality.json").write_text(json.dumps({**results, "llama_server": llama, "ratio": ratio}, indent=2))
    (out / "quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    main()
