"""Build a model directory so that an interrupted build never leaves a half-written model.

Everything is written into a temporary sibling directory and renamed into place at the end. Two
processes asking for the same model at once (two notebooks' servers, a server and a script) build it
once: the second waits on a lock file beside it, then finds the first one's build complete.
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

COMPLETE_MARKER = ".mlx_nb_complete"


def is_complete(dest: Path) -> bool:
    return (dest / COMPLETE_MARKER).exists()


@contextmanager
def _one_builder(dest: Path) -> Iterator[None]:
    """Held while `dest` is built: other processes building it wait here (an advisory lock on a
    hidden sibling file, released by the OS if the builder dies). The file goes when the build ends,
    so nothing is left beside the model; a process that opened it just before then may build again
    at once, and the rename below keeps that safe. Where there is no fcntl (Windows), concurrent
    builders each build and the first rename wins."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = dest.parent / f".{dest.name}.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_atomically(dest: Path, write: Callable[[Path], None]) -> Path:
    dest = Path(dest)
    if is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _one_builder(dest):
        return _build(dest, write)


def _build(dest: Path, write: Callable[[Path], None]) -> Path:
    if is_complete(dest):  # built by another process while this one waited
        return dest
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
