"""bench: a fine-tune on the default model beside mlx_lm.lora's own CLI, and chats while it trains.

    .venv/bin/python bench/training.py [--iters 60]    # writes bench/results/training.md and .json (~8 min)
    .venv/bin/python bench/training.py --only-llama    # phase 5 again, into the same pages (~3 min)

Measured in one run, on the default model (smollm2-135m-instruct) and an invented task (answer an
order as `{"item": ..., "qty": N}`, 200 rows naming made-up items):
1. the default model's weights as a float32 MLX folder (its GGUF blocks dequantized: what
   `Client.train` trains on), and the rows split as `Client.train` splits them, written as mlx_lm's
   train.jsonl / valid.jsonl;
2. `python -m mlx_lm lora --train` on that folder and those files, with the BLAS mlx_nb preloads
   (LD_PRELOAD; alone it runs MLX's bundled one, several times slower here): the tokens/s it reports
   every 10 steps, the first window left out (compilation);
3. `Client.train` on the same folder, rows and settings, nothing else running: its steps' tokens/s
   over the same windows (the issue's >= 0.9x);
4. chats while a fine-tune runs: one chat every 1.5 s on the embedded default model, time to the
   first token and decode tokens/s, median of 10, beside 10 on the idle engine before (the issue's
   first token <= 2x idle, and the decode ratio);
5. where llama.cpp's tools are found ($LLAMA_CPP_BIN): the task trained on the default model itself
   (40 steps), exported as GGUF. As F16: greedy replies to 20 unseen requests from llama-server and
   from this engine on that file, the first 16 tokens compared, and how many of llama-server's
   replies do the task. As Q8_0: perplexity on the validation conversations as plain text (`role:
   content` lines), as llama-perplexity measures it (chunks of 128 tokens, the second half of each
   scored), ours and llama-perplexity's, with the number of chunks each read; the same as Q4_K_M
   where llama-quantize is found (the export calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))

import mlx_nb  # noqa: E402,F401  (the fast BLAS before MLX)

MODEL = "smollm2-135m-instruct"
ASKS = ["I'd like {n} {item}.", "Please send {n} {item}.", "Can I get {n} {item}?", "Order {n} {item} for me.",
        "We need {n} {item} today."]
SETTINGS = dict(batch_size=4, num_layers=8, learning_rate=4e-4, rank=8, scale=20.0)
CLI_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+) [\u25bc\u25b2]\s+([\d,]+)\s+([\d.]+)k")


def order_rows(seed: int = 0, n: int = 200) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        item = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3)))
        qty = rng.randint(1, 99)
        out.append({"messages": [{"role": "user", "content": rng.choice(ASKS).format(n=qty, item=item)},
                                 {"role": "assistant", "content": json.dumps({"item": item, "qty": qty})}]})
    return out


def float_folder(dest: Path) -> Path:
    """The default model as a float32 MLX folder mlx_lm loads (config without the GGUF block map)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_nb.models.sources import resolve
    from mlx_nb.training.worker import trainable_model

    src = resolve(MODEL)
    model, _ = trainable_model(MODEL)
    dest.mkdir(parents=True, exist_ok=True)
    weights = {k: v for k, v in tree_flatten(model.parameters()) if not k.startswith("lm_head")}
    mx.save_safetensors(str(dest / "model.safetensors"), weights)
    config = json.loads((src / "config.json").read_text())
    config.pop("gguf", None)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(f, dest / f.name)
    return dest


def windows(per_step: list[tuple[int, float]], size: int = 10) -> list[float]:
    """tokens/s of each window of `size` steps from (tokens, tokens/s) per step, as mlx_lm reports them."""
    out = []
    for start in range(0, len(per_step) - size + 1, size):
        part = per_step[start:start + size]
        out.append(sum(t for t, _ in part) / sum(t / s for t, s in part))
    return out


def mlx_lm_cli(folder: Path, data: Path, iters: int, out: Path) -> list[float]:
    cmd = [sys.executable, "-m", "mlx_lm", "lora", "--model", str(folder), "--train", "--data", str(data),
           "--iters", str(iters), "--batch-size", str(SETTINGS["batch_size"]), "--num-layers",
           str(SETTINGS["num_layers"]), "--learning-rate", str(SETTINGS["learning_rate"]), "--mask-prompt",
           "--steps-per-report", "10", "--steps-per-eval", str(iters * 2), "--val-batches", "1",
           "--adapter-path", str(out)]
    # the same BLAS as ours (mlx_nb preloads it; `python -m mlx_lm` alone runs MLX's bundled one, several
    # times slower here): the comparison is of the training loops, not of the matmul libraries
    from mlx_nb.runtime import find_blas

    env = dict(os.environ)
    if find_blas():
        env["LD_PRELOAD"] = find_blas()
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [float(m.group(3).replace(",", "")) for m in map(CLI_ROW.match, plain.splitlines()) if m]


def ours(client, folder: Path, rows: list, iters: int, name: str) -> tuple[list[float], dict]:
    job = client.train(rows, name=name, base=str(folder), iters=iters, steps_per_save=iters * 2, progress=False,
                       **SETTINGS)
    train = [e for e in job.losses() if e["kind"] == "train"]
    per_step, before = [], 0
    for e in train:
        per_step.append((e["trained_tokens"] - before, e["tokens_per_second"]))
        before = e["trained_tokens"]
    return windows(per_step), job.status()


def chat_times(client, n: int, gap_s: float) -> list[dict]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        first, pieces = None, 0
        for _ in client.stream(f"Tell me one fact about the number {i + 3}.", max_tokens=48):
            first = first or time.perf_counter()
            pieces += 1
        end = time.perf_counter()
        out.append({"ttft": (first or end) - t0, "decode_tps": (pieces - 1) / (end - first) if pieces > 1 else 0.0})
        time.sleep(gap_s)
    return out


REAL_ITEMS = ("lamps chairs mugs plates forks shirts socks gloves hats boots jackets batteries buckets ropes nails "
              "hammers bricks pillows blankets rugs mirrors clocks radios tablets printers stamps folders").split()


def in_shape(answer: str, qty: int) -> bool:
    try:
        value = json.loads(answer.strip())
    except ValueError:
        return False
    return isinstance(value, dict) and list(value) == ["item", "qty"] and value.get("qty") == qty


def llama_cpp_checks(client, rows: list, valid: list, tmp: Path) -> dict:
    """The exported GGUFs in llama.cpp beside this engine (phase 5); {} without llama.cpp's tools."""
    import httpx

    sys.path.insert(0, str(HERE))
    import servers
    from quality_gguf import bos_if_added, llama_perplexity, perplexity_llama_style

    from mlx_nb.engine import Engine
    from mlx_nb.models import load_model

    if servers.llama_tool("llama-server") is None or servers.llama_tool("llama-perplexity") is None:
        return {}
    job = client.train(rows, name="orders", base=MODEL, iters=40, steps_per_save=100, progress=False, **SETTINGS)
    f16 = Path(job.export(tmp / "orders-f16.gguf", format="gguf", quantize="F16"))
    q8 = Path(job.export(tmp / "orders-q8.gguf", format="gguf", quantize="Q8_0"))
    rng = random.Random(1)
    asks = [(rng.choice(ASKS).format(n=(q := rng.randint(1, 99)), item=item), q) for item in rng.sample(REAL_ITEMS, 20)]
    tokenizer = load_model(str(f16)).tokenizer
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": a}], tokenize=False, add_generation_prompt=True)
             for a, _ in asks]
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts]  # llama-server reads these ids
    with Engine(str(f16), wait=True) as engine:
        ours = [engine.submit(prompt=t, max_tokens=16, temperature=0.0).result(timeout=300).token_ids for t in texts]
    with servers.llama_server(f16, slots=1) as server:
        root = server.base_url.rsplit("/v1", 1)[0]
        theirs = [httpx.post(f"{root}/completion", json={"prompt": p, "n_predict": 16, "temperature": 0.0,
                                                         "return_tokens": True, "cache_prompt": False},
                             timeout=300).json()["tokens"] for p in prompts]
    ends = set(tokenizer.eos_token_ids)  # llama-server's tokens include the end of sequence; ours do not
    theirs = [t[:-1] if t and t[-1] in ends else t for t in theirs]
    same = sum(a[:16] == b[:16] for a, b in zip(ours, theirs))
    done_there = sum(in_shape(tokenizer.decode(t, skip_special_tokens=True), q) for t, (_, q) in zip(theirs, asks))
    done_here = sum(in_shape(tokenizer.decode(t, skip_special_tokens=True), q) for t, (_, q) in zip(ours, asks))
    # Plain text, no chat template: llama-perplexity reads special tokens such as <|im_start|> as
    # characters (split into several easy tokens), where the tokenizer reads one token each, so a
    # templated text would not be the same token sequence on both sides.
    text = "\n\n".join("\n".join(f"{m['role']}: {m['content']}" for m in r["messages"]) for r in valid)
    text_file = tmp / "valid.txt"
    text_file.write_text(text)
    out = {"f16_first16_same": same, "prompts": len(prompts), "task_in_llama_server": done_there,
           "task_here": done_here}
    loaded = load_model(str(q8))
    out["q8_perplexity_ours"], out["q8_scored_tokens"] = perplexity_llama_style(
        loaded, loaded.tokenizer.encode(text), n_ctx=128, bos=bos_if_added(q8))
    try:
        out["q8_perplexity_llama"], out["q8_llama_chunks"] = llama_perplexity(q8, n_ctx=128, text=text_file,
                                                                              chunks=True)
    except Exception as exc:  # noqa: BLE001 - the F16 comparison above still stands
        out["perplexity_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if servers.llama_tool("llama-quantize") is not None:  # Q4_K_M goes through llama-quantize (job.export)
        q4 = Path(job.export(tmp / "orders-q4_k_m.gguf", format="gguf", quantize="Q4_K_M"))
        loaded = load_model(str(q4))
        out["q4km_perplexity_ours"], _ = perplexity_llama_style(loaded, loaded.tokenizer.encode(text), n_ctx=128,
                                                                bos=bos_if_added(q4))
        out["q4km_perplexity_llama"], out["q4km_llama_chunks"] = llama_perplexity(q4, n_ctx=128, text=text_file,
                                                                                  chunks=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--only-llama", action="store_true",
                        help="run phase 5 alone and put it into the existing results/training.json")
    args = parser.parse_args()
    if args.only_llama:
        return only_llama()

    from mlx_nb import Client
    from mlx_nb.client.training import close_manager
    from mlx_nb.training.data import rows_of, split

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["MLX_NB_JOBS_DIR"] = str(tmp / "home")
        folder = float_folder(tmp / "float")
        rows = order_rows()
        _, usable, _ = rows_of(rows)
        train, valid, _ = split(usable, None, SETTINGS["batch_size"], 0)
        data = tmp / "data"
        data.mkdir()
        for name, part in (("train", train), ("valid", valid)):
            (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        client = Client()
        client.chat("warm up", max_tokens=8)

        cli = mlx_lm_cli(folder, data, args.iters, tmp / "cli-adapter")
        mine, status = ours(client, folder, rows, args.iters, "speed")
        idle = chat_times(client, 10, 0.5)
        job = client.train(rows, name="busy", base=str(folder), iters=400, steps_per_save=1000, wait=False,
                           progress=False, **SETTINGS)
        while job.status().get("step", 0) < 3:
            time.sleep(0.2)
        during = chat_times(client, 10, 1.5)
        steps_during = job.status().get("step", 0)
        job.cancel()
        try:
            llama = llama_cpp_checks(client, rows, valid, tmp)
        except Exception as exc:  # noqa: BLE001 - the other phases' results are still written
            llama = {"error": f"{type(exc).__name__}: {exc}"}
        close_manager()

    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    result = {
        "iters": args.iters, "settings": SETTINGS,
        "mlx_lm_cli_tok_s": cli, "ours_tok_s": mine,
        "mlx_lm_cli_mean": statistics.mean(cli[1:]), "ours_mean": statistics.mean(mine[1:]),
        "val_loss_first_last": [e for e in [status.get("val_loss")]],
        "chat_idle": {"ttft_s": med(idle, "ttft"), "decode_tps": med(idle, "decode_tps")},
        "chat_during": {"ttft_s": med(during, "ttft"), "decode_tps": med(during, "decode_tps")},
        "steps_trained_during_chats": steps_during,
        "llama_cpp": llama,
    }
    result["speed_ratio"] = result["ours_mean"] / result["mlx_lm_cli_mean"]
    result["ttft_ratio"] = result["chat_during"]["ttft_s"] / result["chat_idle"]["ttft_s"]
    result["decode_ratio"] = result["chat_during"]["decode_tps"] / result["chat_idle"]["decode_tps"]
    write_pages(result)


def only_llama() -> None:
    """Phase 5 alone (the exported GGUFs in llama.cpp), its part of results/training.json replaced."""
    from mlx_nb import Client
    from mlx_nb.client.training import close_manager
    from mlx_nb.training.data import rows_of, split

    result = json.loads((RESULTS / "training.json").read_text())
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["MLX_NB_JOBS_DIR"] = str(tmp / "home")
        rows = order_rows()
        _, usable, _ = rows_of(rows)
        _, valid, _ = split(usable, None, SETTINGS["batch_size"], 0)
        result["llama_cpp"] = {**llama_cpp_checks(Client(), rows, valid, tmp), "run_alone": True}
        close_manager()
    write_pages(result)


def write_pages(result: dict) -> None:
    cli, mine, steps_during, llama = (result["mlx_lm_cli_tok_s"], result["ours_tok_s"],
                                      result["steps_trained_during_chats"], result["llama_cpp"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "training.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "training.md").write_text(f"""# Fine-tuning: beside mlx_lm.lora's CLI, and chats while it trains

    .venv/bin/python bench/training.py --iters {result['iters']}

The default model (float32 weights from its GGUF blocks), 180 training rows of the order task, batch
{SETTINGS['batch_size']}, LoRA rank {SETTINGS['rank']} on the last {SETTINGS['num_layers']} layers, learning rate
{SETTINGS['learning_rate']}, prompts masked; {result['iters']} steps each. Tokens/s are trained (answer) tokens, as
mlx_lm reports them, per 10 steps, the first 10 left out.

| | tokens/s (mean) | per 10 steps |
|---|---|---|
| `python -m mlx_lm lora` | {result['mlx_lm_cli_mean']:.1f} | {', '.join(f'{x:.0f}' for x in cli)} |
| `Client.train` | {result['ours_mean']:.1f} | {', '.join(f'{x:.0f}' for x in mine)} |
| **ratio** | **{result['speed_ratio']:.2f}x** | |

A chat (48 tokens) every 1.5 s on the default model while a fine-tune runs, against the same chats on
the idle engine (median of 10):

| | first token | decode tokens/s |
|---|---|---|
| idle | {result['chat_idle']['ttft_s'] * 1000:.0f} ms | {result['chat_idle']['decode_tps']:.0f} |
| while training | {result['chat_during']['ttft_s'] * 1000:.0f} ms | {result['chat_during']['decode_tps']:.0f} |
| **ratio** | **{result['ttft_ratio']:.2f}x** | **{result['decode_ratio']:.2f}x** |

The fine-tune trained {steps_during} steps while the chats ran (it is stopped while a chat is answered
and runs between them).
{llama_section(llama)}""")
    print((RESULTS / "training.md").read_text())



def llama_section(llama: dict) -> str:
    if not llama:
        return "\nllama.cpp's tools were not found ($LLAMA_CPP_BIN): the GGUF export was not compared.\n"
    if "error" in llama:
        return f"\nThe GGUF comparison with llama.cpp failed: {llama['error']}\n"
    if "q8_perplexity_llama" in llama:
        ratio = llama["q8_perplexity_ours"] / llama["q8_perplexity_llama"]
        q8 = (f"llama-perplexity {llama['q8_perplexity_llama']:.4f}, ours {llama['q8_perplexity_ours']:.4f} "
              f"(**{(ratio - 1) * 100:+.2f}%**)")
    else:
        q8 = f"ours {llama['q8_perplexity_ours']:.4f}; llama-perplexity failed: {llama['perplexity_error']}"
    q4 = ""
    if "q4km_perplexity_llama" in llama:
        ratio = llama["q4km_perplexity_ours"] / llama["q4km_perplexity_llama"]
        q4 = (f"\n- Q4_K_M (by llama-quantize, through `job.export(..., quantize=\"Q4_K_M\")`): the same text "
              f"({llama['q4km_llama_chunks']} chunks): llama-perplexity {llama['q4km_perplexity_llama']:.4f}, "
              f"ours {llama['q4km_perplexity_ours']:.4f} (**{(ratio - 1) * 100:+.2f}%**).")
    return f"""
## The exported GGUF in llama.cpp

The task trained on the default model itself (40 steps), exported by `job.export(..., format="gguf")`{
" (this part run again alone: `bench/training.py --only-llama`)" if llama.get("run_alone") else ""}.

- F16: greedy replies to {llama['prompts']} unseen requests, the first 16 tokens identical in llama-server
  and in this engine on the same file: **{llama['f16_first16_same']} of {llama['prompts']}**; llama-server's
  replies do the task on {llama['task_in_llama_server']} of {llama['prompts']} (this engine's:
  {llama['task_here']}).
- Q8_0: perplexity on the validation conversations as plain text ({llama['q8_scored_tokens']} tokens scored,
  chunks of 128; llama-perplexity read {llama.get('q8_llama_chunks')} chunks, ours {llama['q8_scored_tokens'] // 63}):
  {q8}.{q4}
"""


if __name__ == "__main__":
    main()
