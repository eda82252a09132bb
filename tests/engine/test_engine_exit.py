"""A process that ends while its Engine decodes exits with its own status: a script that raises, a
notebook kernel shut down mid-answer. Its engine thread used to be inside MLX while Python tore
down, and the process aborted ("terminate called without an active exception", status 134)."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import mlx_nb
    from mlx_nb import Engine
    eng = Engine({model!r}, wait=True)
    h = eng.submit(prompt="hello there", max_tokens=100000, logit_bias={{t: -100 for t in eng.loaded.tokenizer.eos_token_ids}})
    for i, d in enumerate(h):
        if i == 3:
            break
    {ending}
""")


@pytest.mark.parametrize("model,kernels", [("tiny-llama", "auto"), ("tiny-llama", "off"), ("tiny-qwen3.5", "auto")])
@pytest.mark.parametrize("ending,status", [("raise RuntimeError('the script failed')", 1), ("raise SystemExit(7)", 7),
                                           ("pass", 0)])
def test_exits_with_its_own_status_while_decoding(model, kernels, ending, status):
    env = {**os.environ, "MLX_NB_KERNELS": kernels}
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(model=model, ending=ending)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == status, out.stderr[-2000:]
    assert "terminate called" not in out.stderr
    if status == 1:
        assert "RuntimeError: the script failed" in out.stderr
