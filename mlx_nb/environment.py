"""Every `MLX_NB_*` environment variable the code reads, with what it does: one place, rendered into
docs/settings.md, and checked against the source (a variable read anywhere but missing here fails
tests/server/test_server_settings_doc.py).
"""

from __future__ import annotations

VARIABLES = {
    "MLX_NB_HOME": "The data home: converted models, jobs, fine-tunes, the prefix cache (default ~/.cache/mlx_nb).",
    "MLX_NB_JOBS_DIR": "Where jobs, uploaded files and fine-tunes are kept instead of the data home.",
    "MLX_NB_URL": "The server a notebook's `Client()` and magics talk to (set by the server in its kernels).",
    "MLX_NB_TOKEN": "The mlx API key that goes with MLX_NB_URL (set by the server in its kernels).",
    "MLX_NB_PREFIX_CACHE_DIR": "Where prefix-cache entries are kept on disk ('' for memory only).",
    "MLX_NB_QUANTIZE": "Quantize float checkpoints to 4 or 8 bits at load, for the CPU kernels.",
    "MLX_NB_DTYPE": "Force how weights are held: kernels, float32 or native (default: kernels when built).",
    "MLX_NB_KERNELS": "off: use MLX's own ops instead of the native CPU kernels.",
    "MLX_NB_ISA": "portable, avx2 or avx512: force the kernels' instruction set (one the CPU supports).",
    "MLX_NB_THREADS": "Threads the native kernels use (default: the CPUs this process may run on).",
    "MLX_NB_SPIN_US": "How long the kernels' idle threads spin before they sleep, in microseconds.",
    "MLX_NB_ACTIVATIONS": "int8, int16 or auto: the precision of activations in the quantized kernels.",
    "MLX_NB_BLAS": "auto, off or a library path: the BLAS preloaded before MLX for float matmuls.",
    "MLX_NB_HUGE_PAGES": "0: do not back the weights with transparent huge pages.",
    "MLX_NB_NO_STREAM": "1: `%%mlx chat` shows one final answer instead of streaming (for nbval).",
    "MLX_NB_COMPAT_DIR": "Where the compatibility matrix files are read from (default: the package).",
    "MLX_NB_VISION_COMPAT": "The vision verdict file the loader honours ('' for none).",
}


def markdown() -> list[str]:
    """The table of variables, for docs/settings.md."""
    return ["| variable | what it does |", "|---|---|",
            *(f"| `{name}` | {text} |" for name, text in sorted(VARIABLES.items()))]
