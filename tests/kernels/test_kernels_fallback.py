"""Without the kernels (not built, macOS, or MLX_NB_KERNELS=off) everything runs on MLX's own ops,
and runtime_info says which path is in use and why; the portable kernels run the engine exactly too."""

import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys
import mlx_nb
from mlx_nb import Engine
from mlx_nb.compat.reference import reply_tokens
from mlx_nb.engine.inputs.messages import normalize_messages
from mlx_nb.engine.inputs.prompts import encode_prompt, render_chat
from mlx_nb.models import load_model

name, quantize = sys.argv[1], (int(sys.argv[2]) or None)
chats = [[{"role": "user", "content": w * (i + 1)}] for i, w in enumerate(["alpha ", "beta gamma ", "delta "])]
loaded = load_model(name, quantize=quantize)
prompts = [encode_prompt(loaded.tokenizer, render_chat(loaded.tokenizer, normalize_messages(c)), chat=True) for c in chats]
alone = [reply_tokens(loaded, p, 12) for p in prompts]
del loaded
with Engine(name, quantize=quantize, max_batch=4, wait=True) as engine:
    batched = [h.result(timeout=300).token_ids for h in [engine.submit(messages=c, max_tokens=12) for c in chats]]
    status = engine.status()
info = mlx_nb.runtime_info()
print(json.dumps({"kernels": info["kernels"], "policy": info["dtype_policy"], "equal": alone == batched,
                  "peak": status["peak_batch_size"], "swapped": status.get("kernels")}))
"""


def run(env: dict, name: str = "tiny-llama", quantize: int = 0) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, name, str(quantize)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_turned_off_runs_on_mlx_ops_and_says_why():
    got = run({"MLX_NB_KERNELS": "off"})
    assert got["kernels"]["path"] == "mlx" and "MLX_NB_KERNELS=off" in got["kernels"]["reason"]
    assert got["policy"] == "float32"
    assert got["equal"] and got["peak"] == 3


def test_portable_kernels_run_the_engine_exactly():
    from mlx_nb import kernels

    if not kernels.available():
        import pytest

        pytest.skip(f"the kernels are not built here: {kernels.info()['reason']}")
    got = run({"MLX_NB_ISA": "portable"}, quantize=8)
    assert got["kernels"]["isa"] == "portable" and got["policy"] == "kernels"
    assert got["equal"] and got["peak"] == 3
    assert got["swapped"]["swapped"]["float linear quantized to 8 bits"] > 0
