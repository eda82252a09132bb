"""Jobs and files on disk: what a dataset job must not lose.

A job is a folder under `<data home>/jobs/<id>/`:
- `job.json`: what it is (kind, endpoint, model, settings, fingerprint, status, timestamps),
  replaced atomically (temporary file, fsync, rename, fsync of the folder) on every change;
- `input.jsonl`: its request lines, one per row, written once before the job is announced;
- `results.jsonl`: one line per finished row (its result or its error), appended and fsync'd as
  the row finishes.

Why append-only JSONL and not SQLite: one writer per job (the process that runs it holds the job's
lock), rows that only ever get added, a format the Batch API hands out as it is, and a file a
person can read with `head`. A crash can cut only the last line short: reading skips a line that
does not parse, and resuming cuts it off before appending. A row is done when its line is on disk;
a resumed job runs exactly the rows that have none, so no row is recorded twice and none is lost.

Uploaded files (the Batch API's `/v1/files`) and a batch's output and error files live under
`<data home>/files/` as `<id>` (the bytes) and `<id>.json` (the file object). Both kinds count
against one disk budget; finished jobs expire after a time to live, their output files with them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

DEFAULT_DISK_BYTES = 2 * 2**30  # what jobs and files may hold on disk together
DEFAULT_TTL_S = 7 * 24 * 3600.0  # a finished job (and its output files) is deleted this long after it ended
FINISHED = ("completed", "failed", "cancelled", "expired")


class StoreFull(RuntimeError):
    """Writing this would take the store past its disk budget (the message says how far and what to do)."""


def data_home() -> Path:
    """Where jobs and files live: $MLX_NB_JOBS_DIR, else the data home ($MLX_NB_HOME)."""
    if os.environ.get("MLX_NB_JOBS_DIR"):
        return Path(os.environ["MLX_NB_JOBS_DIR"]).expanduser()
    from mlx_nb.models.sources import home

    return home()


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def write_json_atomically(path: Path, value: Any) -> None:
    """Readers (and a process killed mid-write) see the old content or the new, never half of one."""
    write_bytes_atomically(path, json.dumps(value, ensure_ascii=False).encode())


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` whole or keeps what it held: a temporary file, fsync, rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number from 1, parsed value or the exception) for every non-empty line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except (ValueError, RecursionError) as exc:
                yield number, exc


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0


class JobFolder:
    """One job's folder: its record, its input lines and its finished rows."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.id = self.path.name

    @property
    def record_path(self) -> Path:
        return self.path / "job.json"

    @property
    def input_path(self) -> Path:
        return self.path / "input.jsonl"

    @property
    def results_path(self) -> Path:
        return self.path / "results.jsonl"

    def record(self) -> dict:
        with open(self.record_path, encoding="utf-8") as f:
            return json.load(f)

    def update(self, **changes: Any) -> dict:
        """The record with `changes`, written atomically (only the process running the job writes it)."""
        record = {**self.record(), **changes}
        write_json_atomically(self.record_path, record)
        return record

    def inputs(self) -> Iterator[dict]:
        for _number, value in read_jsonl(self.input_path):
            yield value

    def results(self) -> dict[int, dict]:
        """Finished rows by row index (the first line for a row wins; a torn last line is skipped)."""
        out: dict[int, dict] = {}
        if not self.results_path.exists():
            return out
        for _number, value in read_jsonl(self.results_path):
            if isinstance(value, dict) and isinstance(value.get("row"), int):
                out.setdefault(value["row"], value)
        return out

    def open_results(self) -> "ResultLog":
        return ResultLog(self.results_path)


class ResultLog:
    """The job's results file, opened to append finished rows durably (one writer: the job's runner)."""

    def __init__(self, path: Path):
        self.path = path
        self._cut_torn_tail()
        self._f = open(path, "ab")

    def _cut_torn_tail(self) -> None:
        """A crash mid-append leaves a last line without its newline: cut it so the next row starts clean."""
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
                f.flush()
                os.fsync(f.fileno())

    def append(self, rows: Iterable[dict]) -> None:
        """Write rows and make them durable before returning (one fsync for the lot)."""
        data = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)
        if not data:
            return
        self._f.write(data)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


class Store:
    """Every job and file under one data home, within a disk budget."""

    def __init__(self, root: Optional[Path] = None, disk_bytes: int = DEFAULT_DISK_BYTES,
                 ttl_s: float = DEFAULT_TTL_S):
        self.root = Path(root) if root is not None else data_home()
        self.jobs_dir = self.root / "jobs"
        self.files_dir = self.root / "files"
        self.disk_bytes = int(disk_bytes)
        self.ttl_s = float(ttl_s)

    # -- jobs ----------------------------------------------------------------------------------
    def job(self, job_id: str) -> JobFolder:
        folder = JobFolder(self.jobs_dir / job_id)
        if "/" in job_id or job_id.startswith(".") or not folder.record_path.exists():
            raise KeyError(job_id)
        return folder

    def jobs(self) -> list[JobFolder]:
        """Every job, the newest first."""
        if not self.jobs_dir.exists():
            return []
        found = [JobFolder(p) for p in self.jobs_dir.iterdir()
                 if not p.name.startswith(".") and (p / "job.json").exists()]  # not one still being made
        return sorted(found, key=lambda j: _created(j), reverse=True)

    def create_job(self, record: dict, lines: list[dict]) -> JobFolder:
        """A new job folder holding `lines` and `record`, complete before anyone can list it."""
        data = b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in lines)
        self.make_room(len(data))
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.jobs_dir / f".{record['id']}.tmp-{uuid.uuid4().hex[:6]}"
        tmp.mkdir()
        try:
            with open(tmp / "input.jsonl", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            write_json_atomically(tmp / "job.json", record)
            os.replace(tmp, self.jobs_dir / record["id"])
            _fsync_dir(self.jobs_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return JobFolder(self.jobs_dir / record["id"])

    def delete_job(self, job_id: str) -> None:
        shutil.rmtree(self.jobs_dir / job_id, ignore_errors=True)

    # -- files ---------------------------------------------------------------------------------
    def create_file(self, data: bytes, filename: str, purpose: str) -> dict:
        """Store bytes as a file object (OpenAI's shape) and return it."""
        self.make_room(len(data))
        self.files_dir.mkdir(parents=True, exist_ok=True)
        meta = {"id": new_id("file"), "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}
        write_bytes_atomically(self.files_dir / meta["id"], data)
        write_json_atomically(self.files_dir / f"{meta['id']}.json", meta)
        return meta

    def file(self, file_id: str) -> dict:
        path = self.files_dir / f"{file_id}.json"
        if "/" in file_id or file_id.startswith(".") or not path.exists():
            raise KeyError(file_id)
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def file_path(self, file_id: str) -> Path:
        self.file(file_id)
        return self.files_dir / file_id

    def files(self, purpose: Optional[str] = None) -> list[dict]:
        if not self.files_dir.exists():
            return []
        out = []
        for meta_path in self.files_dir.glob("*.json"):
            try:
                with open(meta_path, encoding="utf-8") as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                continue
            if purpose is None or meta.get("purpose") == purpose:
                out.append(meta)
        return sorted(out, key=lambda m: m.get("created_at", 0), reverse=True)

    def delete_file(self, file_id: str) -> bool:
        try:
            self.file(file_id)
        except KeyError:
            return False
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)
        (self.files_dir / file_id).unlink(missing_ok=True)
        return True

    # -- the budget ----------------------------------------------------------------------------
    def used_bytes(self) -> int:
        return folder_bytes(self.jobs_dir) + folder_bytes(self.files_dir)

    def expire(self, now: Optional[float] = None) -> list[str]:
        """Delete finished jobs past their time to live, with their output files; their ids."""
        now = time.time() if now is None else now
        gone = []
        for folder in self.jobs():
            try:
                record = folder.record()
            except (OSError, ValueError):
                continue
            ended = record.get("ended_at")
            if record.get("status") in FINISHED and ended is not None and now - ended > self.ttl_s:
                self._drop(folder, record)
                gone.append(folder.id)
        return gone

    def make_room(self, size: int) -> None:
        """Room for `size` more bytes: expired jobs go first, then the oldest finished ones; StoreFull
        when even that is not enough."""
        self.expire()
        used = self.used_bytes()
        if used + size <= self.disk_bytes:
            return
        for folder in reversed(self.jobs()):  # the oldest first
            record = folder.record()
            if record.get("status") not in FINISHED:
                continue
            used -= self._drop(folder, record)
            if used + size <= self.disk_bytes:
                return
        raise StoreFull(f"{size} more bytes would take the jobs and files under {self.root} past their disk budget "
                        f"({self.disk_bytes} bytes, {used} used by running jobs and files): delete files or jobs you "
                        "no longer need, or raise the budget (MLXExtension.jobs_disk_bytes / Store(disk_bytes=))")

    def _drop(self, folder: JobFolder, record: dict) -> int:
        freed = folder_bytes(folder.path)
        for key in ("output_file_id", "error_file_id"):
            if record.get(key):
                try:
                    freed += self.file_path(record[key]).stat().st_size
                except (KeyError, OSError):
                    pass
                self.delete_file(record[key])
        self.delete_job(folder.id)
        return freed


def _created(folder: JobFolder) -> float:
    try:
        return float(folder.record().get("created_at", 0))
    except (OSError, ValueError):
        return 0.0
