"""The runtime reports its BLAS, and the fast BLAS is faster than the bundled reference one."""

import json
import subprocess
import sys

import pytest

import mlx_nb
from mlx_nb.runtime import find_blas

PROBE = """
import json, time, mlx_nb
import mlx.core as mx
a = mx.random.normal((128, 576)); b = mx.random.normal((576, 1536))
mx.eval(a @ b)
n = 0; t = time.perf_counter()
while time.perf_counter() - t < 1.0:
    mx.eval(a @ b); n += 1
print(json.dumps({"gflops": n * 2 * 128 * 576 * 1536 / (time.perf_counter() - t) / 1e9,
                  "blas": mlx_nb.runtime_info()["blas_fast"]}))
"""


def probe(blas: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "MLX_NB_BLAS": blas},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_runtime_info_reports_blas_and_policy():
    info = mlx_nb.runtime_info()
    assert set(info) >= {"device", "blas", "blas_fast", "dtype_policy", "versions", "kernels"}
    cpu_policy = "kernels" if info["kernels"]["path"] == "native" else "float32"
    assert info["dtype_policy"] == (cpu_policy if info["device_kind"] == "cpu" else "native")
    assert info["blas_fast"] == (find_blas() is not None)
    assert info["versions"]["mlx"]


def test_blas_off_and_explicit_choice():
    assert find_blas("off") is None
    assert find_blas("/opt/my/libblas.so") == "/opt/my/libblas.so"


@pytest.mark.skipif(find_blas() is None, reason="no fast BLAS installed (libopenblas0-pthread or the mkl wheel)")
def test_batched_fp32_matmul_is_faster_with_the_fast_blas():
    fast, slow = probe("auto"), probe("off")
    assert fast["blas"] and not slow["blas"]
    assert fast["gflops"] > 2 * slow["gflops"], (fast, slow)


def test_importing_mlx_first_warns():
    code = "import mlx.core, warnings\nwarnings.simplefilter('error')\nimport mlx_nb"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if find_blas() is None:
        assert out.returncode == 0
    else:
        assert out.returncode != 0 and "imported before mlx_nb" in out.stderr
