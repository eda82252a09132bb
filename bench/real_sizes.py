"""The models people bring, side by side with llama.cpp's llama-server on the same GGUF file: GGUFs in
the shapes of Llama-3.2-1B and Qwen2.5-3B quantized to Q4_K_M by llama-quantize (bench/real_models.py).

For each file, both servers up at once and their runs taking turns: 1, 8 and 32 concurrent streams,
a ~2k-token prompt read alone, each server's peak resident memory over the whole run, and the
weight bytes one decode step reads, turned into GB/s at one stream against this machine's read
bandwidth.
"""

from __future__ import annotations

import httpx

import limits
import memory
import real_models
import servers
import workload

LEVELS = (1, 8, 32)


def weights_bytes(server) -> int:
    """What our server holds as weights (status route): what one decode step reads."""
    r = httpx.get(f"{server.base_url}/status", headers={"Authorization": f"token {server.api_key}"}, timeout=30)
    return int(r.json()["weights"]["bytes"])


def gguf_weight_bytes(path) -> int:
    """The tensor bytes of a GGUF (what llama.cpp reads for one token: every matrix once)."""
    from mlx_nb.models.gguf_read import read

    _, tensors = read(path)
    return sum(t.data.nbytes for t in tensors.values())


def measure(name: str, prompt_text: str, max_tokens: int, reps: int, logs) -> dict:
    from run import measure_side_by_side

    path = real_models.shaped(name)
    print(f"{name}: {path.name}", flush=True)
    with servers.mlx_nb_server(str(path), log=logs / f"mlx-nb-{name}.log") as ours, \
            servers.llama_server(path, log=logs / f"llama-server-{name}.log") as cpp:
        with memory.PeakRSS({"ours": ours.proc.pid, "llama_server": cpp.proc.pid}) as peak:
            runs = measure_side_by_side([ours, cpp], list(LEVELS), max_tokens, reps, prompt_text=prompt_text)
        held = weights_bytes(ours)
    out = {"file": path.name, "file_bytes": path.stat().st_size, "weights_bytes": held,
           "gguf_weight_bytes": gguf_weight_bytes(path), "runs": {"ours": runs[0], "llama_server": runs[1]},
           "peak_rss": dict(peak.bytes)}
    return out


def run_all(prompt_text: str, max_tokens: int, reps: int, logs, names=None) -> dict:
    if servers.llama_server_binary() is None:
        print("real sizes skipped: llama-server not found (set LLAMA_CPP_BIN)", flush=True)
        return {}
    machine_gbs = limits.read_bandwidth_gbs()
    models = {}
    for name in names or list(real_models.SHAPES):
        models[name] = measure(name, prompt_text, max_tokens, reps, logs)
    return {"read_bandwidth_gbs": machine_gbs, "models": models}


def bandwidth(model: dict, key: str) -> float:
    """GB/s of weights one stream reads: bytes a token times tokens/s at one stream."""
    run = model["runs"][key]
    tps = (run["levels"].get(1) or run["levels"].get("1"))["stream_tps"]  # the decode rate, first token aside
    return (model["weights_bytes"] if key == "ours" else model["gguf_weight_bytes"]) * tps / 1e9
