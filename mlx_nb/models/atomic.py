"""Build a model directory so that an interrupted build never leaves a half-written model.

Everything is written into a temporary sibling directory and renamed into place at the end.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

COMPLETE_MARKER = ".mlx_nb_complete"


def is_complete(dest: Path) -> bool:
    return (dest / COMPLETE_MARKER).exists()


def build_atomically(dest: Path, write: Callable[[Path], None]) -> Path:
    dest = Path(dest)
    if is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        if is_complete(dest):  # a concurrent builder (another process) finished first: keep its copy
            return dest
        if dest.exists():  # a stale incomplete directory from an older version
            shutil.rmtree(dest)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not is_complete(dest):  # not a concurrent builder that won the race
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def write_text_atomically(dest: Path, text: str) -> Path:
    """Write a file so that readers see the old content or the new, never a half-written one."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(text)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
