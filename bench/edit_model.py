"""A model that does the editing workload's task: the default model's real weights, fine-tuned here
(LoRA, fused) to rewrite a function exactly with one name renamed, then quantized to Q4_K_M by
llama.cpp's `llama-quantize`.

    .venv/bin/python bench/edit_model.py [KIND]    # makes (or finds) the file, prints its path

Why: prompt lookup pays when an answer repeats its prompt, as a coding model's edits do. The 135M
default model mostly does not: asked to rename a name in a function, it rewrites the function freely
(about half of its answers' text is the edit asked for; bench/results/speculation.md), so a bench on
it measures the model more than the lookup. No real-weights coding model can be fetched here, so this
makes one of the default model's own size and layout, whose step costs what the default's does.

Q4_K_M (the most common GGUF type, 105 MB against the default's 98 MB) and not the default's own
Q4_1: the default's weights sit exactly on Q4_1's grid, so re-quantizing the fused weights to Q4_1
rounds most of the fine-tune away (measured: it then renames 8 of 37 names; Q4_K_M and Q8_0 rename
as the float32 model does).

The training functions come from the standard library's packages (email/, json/, asyncio/, ...);
the bench's editing cases come from its top-level modules, so none is trained on. Seeded; cached
under $MLX_NB_HOME/bench (the float32 source too, to quantize again). Needs llama.cpp's tools (see
servers.llama_tool), as real_models does.
"""

from __future__ import annotations

import ast
import builtins
import io
import random
import sys
import sysconfig
import textwrap
import time
import tokenize
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

SEED = 0
KIND = "Q4_K_M"  # not the default's Q4_1: see the docstring
STEPS = 240
RANK = 16
LR = 2e-4
LINES = (6, 40)
MAX_TOKENS = 900  # a training example's prompt and answer
NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_norm": "input_layernorm",
         "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
         "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def rename(code: str, old: str, new: str) -> str:
    """`code` with the name `old` (not an attribute after a dot) renamed to `new`, token by token."""
    out, prev = [], None
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.NAME and tok.string == old and not (prev and prev.string == "."):
            tok = tok._replace(string=new)
        out.append(tok)
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            prev = tok
    return tokenize.untokenize(out)


def functions(paths, lines=LINES, min_uses: int = 2) -> list[tuple[str, list[str], str]]:
    """(where, names it is fair to rename, code) of every function of `lines` lines in `paths`: its
    arguments and the names it assigns that it uses at least `min_uses` times (not self, not a
    builtin's name)."""
    found = []
    for path in paths:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not lines[0] <= node.end_lineno - node.lineno + 1 <= lines[1]:
                continue
            uses: dict[str, int] = {}
            local = set()  # arguments and names assigned in the function
            for sub in ast.walk(node):
                name = sub.id if isinstance(sub, ast.Name) else sub.arg if isinstance(sub, ast.arg) else None
                if name is not None:
                    uses[name] = uses.get(name, 0) + 1
                    if isinstance(sub, ast.arg) or isinstance(sub.ctx, ast.Store):
                        local.add(name)
            names = sorted(k for k in local if uses[k] >= min_uses and len(k) > 1 and k != "self"
                           and not k.startswith("__") and not hasattr(builtins, k))
            if names:
                found.append((f"{path.stem}.{node.name}", names, textwrap.dedent(ast.get_source_segment(source, node)) + "\n"))
    return found


def training_edits(seed: int = SEED) -> list[tuple[str, str, str]]:
    """(old name, new name, code) from the standard library's packages (never its top-level modules,
    where the bench's cases come from), in a seeded order; new names in a few styles, so the model
    learns to copy whatever it is asked for rather than one prefix."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in stdlib.glob("*/**/*.py")
                   if not {"test", "tests", "site-packages", "idlelib"} & set(p.relative_to(stdlib).parts))
    rng = random.Random(seed)
    found = functions(paths)
    rng.shuffle(found)
    styles = [lambda o: f"new_{o}", lambda o: f"{o}_value", lambda o: f"the_{o}", lambda o: o.upper(),
              lambda o: f"{o}2", lambda o: "".join(w.capitalize() for w in o.split("_"))]
    edits = []
    for _, names, code in found:
        old = rng.choice(names)
        new = rng.choice(styles)(old)
        if new and new != old:
            edits.append((old, new, code))
    return edits


def examples(tokenizer, edits, limit: int = MAX_TOKENS):
    """(tokens, index where the answer starts) of each edit that fits in `limit` tokens: the bench's
    request, answered with the renamed code."""
    from speculation import rename_messages

    for old, new, code in edits:
        try:
            answer = rename(code, old, new)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            continue
        messages = rename_messages(old, new, code)
        prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                                  add_special_tokens=False)
        full = tokenizer.encode(tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}],
                                                              tokenize=False), add_special_tokens=False)
        if full[:len(prompt)] == prompt and len(full) <= limit:
            yield full, len(prompt)


def float_model(src: Path):
    """The GGUF's weights, dequantized to float32, in mlx_lm's Llama (GGUF's rotary layout, so
    traditional RoPE), and the GGUF reader."""
    import gguf
    import mlx.core as mx
    from mlx_lm.models import llama

    reader = gguf.GGUFReader(str(src))
    field = lambda k: reader.fields[k].contents()  # noqa: E731
    args = llama.ModelArgs(
        model_type="llama", hidden_size=int(field("llama.embedding_length")),
        num_hidden_layers=int(field("llama.block_count")), intermediate_size=int(field("llama.feed_forward_length")),
        num_attention_heads=int(field("llama.attention.head_count")),
        num_key_value_heads=int(field("llama.attention.head_count_kv")),
        rms_norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")), vocab_size=int(field("llama.vocab_size")),
        rope_theta=float(field("llama.rope.freq_base")), rope_traditional=True, tie_word_embeddings=True)
    model = llama.Model(args)
    weights = {}
    for t in reader.tensors:
        base, _, kind = t.name.rpartition(".")
        parts = base.split(".")
        name = (f"model.layers.{parts[1]}.{NAMES[parts[2]]}" if parts[0] == "blk" else NAMES[base]) + "." + kind
        weights[name] = mx.array(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
    model.load_weights(list(weights.items()))
    return model, reader


def train(model, tokenizer, steps: int = STEPS, seed: int = SEED, log=print) -> list[float]:
    """LoRA (rank RANK, every projection of every layer) trained on `steps` edits, loss on the
    answers only; fused into the weights. The losses, for the log."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    mx.random.seed(seed)
    model.freeze()
    keys = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    linear_to_lora_layers(model, len(model.layers), {"rank": RANK, "scale": 2.0, "dropout": 0.0, "keys": keys})
    data = list(examples(tokenizer, training_edits(seed)))[:steps]

    def loss_fn(model, tokens, start):
        logits = model(tokens[None, :-1])[0]
        return nn.losses.cross_entropy(logits[start - 1:], tokens[start:]).mean()

    opt = optim.Adam(learning_rate=optim.cosine_decay(LR, len(data)))
    step = nn.value_and_grad(model, loss_fn)
    losses, began = [], time.time()
    for i, (tokens, start) in enumerate(data):
        loss, grads = step(model, mx.array(tokens), start)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        losses.append(loss.item())
        if i % 20 == 0 or i == len(data) - 1:
            log(f"step {i + 1}/{len(data)}  loss {np.mean(losses[-20:]):.3f}  {time.time() - began:.0f} s")
    fused = [(n, m.fuse(dequantize=True)) for n, m in model.named_modules() if hasattr(m, "fuse")]
    model.update_modules(tree_unflatten(fused))
    return losses


def write_gguf(model, reader, dest: Path) -> Path:
    """`model`'s weights as float32 in a GGUF with `reader`'s metadata (tokenizer, chat template...),
    written to a temporary name, then renamed."""
    import gguf
    import mlx.core as mx
    from mlx.utils import tree_flatten

    back = {v: k for k, v in NAMES.items()}
    tmp = dest.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.contents()
        if key == "general.file_type":
            value = int(gguf.LlamaFileType.ALL_F32)
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, f.types[0], sub)
    for name, value in tree_flatten(model.parameters()):
        if name == "lm_head.weight":
            continue
        base, _, kind = name.rpartition(".")
        if base.startswith("model.layers."):
            _, _, i, rest = base.split(".", 3)
            gname = f"blk.{i}.{back[rest]}"
        else:
            gname = back[base]
        w.add_tensor(f"{gname}.{kind}", np.array(value.astype(mx.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(dest)
    return dest


def edit_model(kind: str = KIND, steps: int = STEPS, log=print) -> Path:
    """The fine-tuned model quantized to `kind` by llama-quantize, made once under
    $MLX_NB_HOME/bench (its float32 source is kept beside it, to quantize again)."""
    from real_models import bench_dir, quantize
    from transformers import AutoTokenizer

    from mlx_nb.models.sources import _smollm2_gguf, resolve

    dest = bench_dir() / f"smollm2-135m-edit-{kind}.gguf"
    if dest.exists():
        return dest
    source = bench_dir() / "smollm2-135m-edit-F32.gguf"
    if not source.exists():
        tokenizer = AutoTokenizer.from_pretrained(str(resolve("smollm2-135m-instruct")))
        model, reader = float_model(_smollm2_gguf())
        train(model, tokenizer, steps, log=log)
        write_gguf(model, reader, source)
    return quantize(source, dest, kind)


if __name__ == "__main__":
    print(edit_model(*sys.argv[1:2]))
