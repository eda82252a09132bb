"""The fine-tunes of one process (a server, or a notebook with no server): one at a time, queued,
each a worker process (training/worker.py) watched by a thread here.

- `create` checks everything a user can get wrong before any step runs (settings, rows, lengths
  against `max_seq_length`, a name already used) and writes the job folder; the job then waits
  its turn. Jobs live under `<data home>/training/jobs/<id>/` with the same guarantees as dataset
  jobs (jobs/store.py): the record replaced atomically, rows written before the job exists.
- While a worker runs, its checkpoints and, at the end, its adapter are handed to `serve(name,
  folder, base)` as they appear (`name:step-N`, then `name`), so the running engines serve them per
  request beside the base model without a reload.
- The worker yields to chats: while `busy()` says interactive requests are running it is stopped
  (SIGSTOP) and continued after (SIGCONT), so a chat's first token never waits for a training
  step; after `hold_max_s` of continuous hold it runs `share_s` before it is stopped again, so
  sustained chat traffic cannot starve it. It runs at a lower priority (`nice`) and, given
  `threads`, on that many BLAS threads.
- A worker that dies without finishing (killed, out of memory) is started again from its last
  checkpoint, twice; one that fails with an error fails its job with the error's last line. A
  process that starts finds the jobs left unfinished by one that died and runs them again.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_nb.jobs.store import JobFolder, Store, data_home, new_id, read_jsonl
from mlx_nb.training.data import TrainingDataError, rows_of, split
from mlx_nb.training.settings import TrainSettings
from mlx_nb.training.worker import ADAPTER, CHECKPOINTS, EVENTS, checkpoint_name

UNFINISHED = ("queued", "running")
RESTARTS = 2  # a worker that dies without an error is started again from its checkpoint this often
POLL_S = 0.02


class TrainingError(ValueError):
    """A fine-tune that cannot be created as asked; the message says what to change."""


def _child_setup(nice: int) -> Callable[[], None]:
    def setup():
        os.nice(nice)
        try:  # die with the process that started us: no orphan holding the cores
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    return setup


class TrainManager:
    def __init__(self, root: Optional[Path] = None, serve: Optional[Callable[[str, str, str], None]] = None,
                 busy: Optional[Callable[[], bool]] = None, name_taken: Optional[Callable[[str], bool]] = None,
                 nice: int = 10, threads: Optional[int] = None, hold_max_s: float = 2.0, share_s: float = 0.25):
        # no disk budget and no time to live: a dataset job's results are evicted to make room, an
        # adapter someone trained is kept until they delete it
        self.store = Store((Path(root) if root is not None else data_home()) / "training", disk_bytes=2**62,
                           ttl_s=float("inf"))
        self.serve = serve or (lambda name, folder, base: None)
        self.busy = busy or (lambda: False)
        self.name_taken = name_taken or (lambda name: False)
        self.nice, self.threads = nice, threads
        self.hold_max_s, self.share_s = hold_max_s, share_s
        self.adapters: dict[str, str] = {}  # name -> folder, of every checkpoint and adapter served so far
        self.bases: dict[str, str] = {}  # name -> the base model it was trained on (served only on that one)
        self.lock = threading.Lock()
        self.queue: list[str] = []
        self.proc: Optional[subprocess.Popen] = None
        self.current: Optional[str] = None
        self.cancelled: set[str] = set()
        self._stopped = False  # the running worker is stopped for a chat (SIGSTOP)
        self.closed = False
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mlx-nb-training", daemon=True)
        self.thread.start()

    # -- creating ------------------------------------------------------------------------------
    def create(self, data: Any, base: str, name: str, val: Any = None, **settings: Any) -> str:
        """A queued fine-tune of `base` on `data`, served as `base@name` when done; its id. The same
        fine-tune asked for again (same name, rows and settings: its fingerprint) is that job, resumed
        if it had not finished, so running a cell again never trains twice."""
        try:
            s = TrainSettings.from_dict({"base": base, "name": name, **settings}).check()
            shape, rows, dropped = rows_of(data)
            train, valid, val_dropped = split(rows, val, s.batch_size, s.seed)
        except (ValueError, TypeError) as exc:
            raise TrainingError(str(exc)) from None
        fingerprint = hashlib.sha256(json.dumps([s.to_dict(), train, valid], sort_keys=True, ensure_ascii=False,
                                                default=str).encode()).hexdigest()
        kept = [r for r in self._records() if r.get("status") not in ("cancelled", "failed")]
        for r in kept:  # the same fine-tune asked for again (a cell run again): that job
            if r.get("fingerprint") == fingerprint:
                if r.get("status") in UNFINISHED:
                    self._enqueue(r["id"])  # resumed from its last checkpoint, if no process runs it
                return r["id"]
        if self.name_taken(name) or any(r.get("settings", {}).get("name") == name for r in kept):
            raise TrainingError(f"an adapter named {name!r} exists already with other rows or settings: pick "
                                "another name")
        truncated = self._check_lengths(s, train + valid)
        record = {"id": new_id("ftjob"), "object": "fine_tuning.job", "kind": "train", "status": "queued",
                  "created_at": time.time(), "settings": s.to_dict(), "shape": shape, "fingerprint": fingerprint,
                  "rows": {"train": len(train), "valid": len(valid), "dropped": {**dropped, **val_dropped},
                           "truncated": truncated},
                  "total_steps": s.steps(len(train)), "step": 0}
        lines = [{"split": "train", "row": r} for r in train] + [{"split": "valid", "row": r} for r in valid]
        self.store.create_job(record, lines)
        self._enqueue(record["id"])
        return record["id"]

    def _check_lengths(self, s: TrainSettings, rows: list[dict]) -> int:
        """How many rows are longer than `max_seq_length` (cut when `truncate`, else refused)."""
        from mlx_lm.tokenizer_utils import load as load_tokenizer

        from mlx_nb.models.loader import read_config
        from mlx_nb.models.sources import resolve

        try:
            path = resolve(s.base)
            if "vision_config" in read_config(path):
                raise TrainingError(f"{s.base} is a vision model: fine-tuning trains language models only")
            tokenizer = load_tokenizer(path)
        except TrainingError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unknown or broken model is one message to the user
            raise TrainingError(f"cannot train {s.base}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
        long = []
        for i, row in enumerate(rows):
            if "messages" in row:
                n = len(tokenizer.apply_chat_template(row["messages"], tokenize=True))
            elif "prompt" in row:
                n = len(tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]},
                                                       {"role": "assistant", "content": row["completion"]}],
                                                      tokenize=True))
            else:
                n = len(tokenizer.encode(row["text"]))
            if n > s.max_seq_length:
                long.append((i, n))
        if long and not s.truncate:
            i, n = long[0]
            raise TrainingError(f"{len(long)} row(s) are longer than max_seq_length={s.max_seq_length} tokens (row {i}"
                                f" has {n}): shorten them, raise max_seq_length, or pass truncate=True to cut them")
        return len(long)

    # -- reading -------------------------------------------------------------------------------
    def _records(self) -> list[dict]:
        out = []
        for folder in self.store.jobs():
            try:
                out.append(folder.record())
            except (OSError, ValueError):
                pass
        return out

    def describe(self, job_id: str) -> dict:
        """The job's record, with its last losses, speed and ETA read from its events."""
        folder = self.store.job(job_id)
        record = folder.record()
        events = self.events(job_id)
        train = [e for e in events if e.get("kind") == "train"]
        val = [e for e in events if e.get("kind") == "val"]
        out = {k: v for k, v in record.items() if k != "pid"}
        if job_id in self.cancelled and record["status"] in UNFINISHED:
            out["status"] = "cancelling"
        elif record["status"] == "completed" and self.current == job_id:
            out["status"] = "running"  # trained, its adapter not served yet: not done for whoever waits on it
        if train:
            last = train[-1]
            out["step"] = last["step"]
            out["train_loss"] = last["train_loss"]
            out["tokens_per_second"] = last["tokens_per_second"]
            out["peak_memory_gb"] = last["peak_memory_gb"]
            recent = train[-20:]
            if len(recent) > 1 and record["status"] == "running":
                per_step = (recent[-1]["time"] - recent[0]["time"]) / (recent[-1]["step"] - recent[0]["step"] or 1)
                out["eta_s"] = round(per_step * (record["total_steps"] - last["step"]), 1)
        if val:
            out["val_loss"] = val[-1]["val_loss"]
        out["adapters"] = self.served(job_id)
        out["paused"] = self.current == job_id and self._stopped
        return out

    def events(self, job_id: str, since_step: int = -1) -> list[dict]:
        path = self.store.job(job_id).path / EVENTS
        if not path.exists():
            return []
        return [v for _, v in read_jsonl(path) if isinstance(v, dict) and v.get("step", 0) > since_step]

    def served(self, job_id: str) -> dict[str, str]:
        """{adapter name: folder} of the job's checkpoints and final adapter on disk."""
        job = self.store.job(job_id)
        folder, name = job.path, job.record()["settings"]["name"]
        out = {}
        for ck in sorted((folder / CHECKPOINTS).glob("step-*")) if (folder / CHECKPOINTS).exists() else []:
            if (ck / "state.json").exists():
                out[f"{name}:step-{int(ck.name.split('-')[1])}"] = str(ck)
        if (folder / ADAPTER / "adapters.safetensors").exists():
            out[name] = str(folder / ADAPTER)
        return out

    def list(self) -> list[dict]:
        out = []
        for folder in self.store.jobs():
            try:
                out.append(self.describe(folder.id))
            except (KeyError, OSError, ValueError):
                pass
        return out

    def wait(self, job_id: str, timeout: Optional[float] = None) -> dict:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.describe(job_id)
            if info["status"] not in UNFINISHED and job_id not in self.queue and self.current != job_id:
                return info
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"fine-tune {job_id} is still {info['status']} at step {info.get('step', 0)}")
            time.sleep(0.1)

    # -- running -------------------------------------------------------------------------------
    def _enqueue(self, job_id: str) -> None:
        with self.lock:
            if job_id not in self.queue and job_id != self.current:
                self.queue.append(job_id)
        self.wake.set()

    def resume_unfinished(self) -> list[str]:
        """Queue the jobs a process that died left queued or running (oldest first)."""
        found = [r["id"] for r in sorted(self._records(), key=lambda r: r.get("created_at", 0))
                 if r.get("status") in UNFINISHED]
        for job_id in found:
            self._enqueue(job_id)
        for folder in self.store.jobs():  # adapters of finished jobs: served again
            self._publish(folder)
        return found

    def cancel(self, job_id: str) -> dict:
        record = self.store.job(job_id).record()
        if record["status"] in UNFINISHED:
            with self.lock:
                self.cancelled.add(job_id)
                if job_id in self.queue:
                    self.queue.remove(job_id)
                proc = self.proc if self.current == job_id else None
            if proc is not None:
                self._signal(proc, signal.SIGKILL)
            else:
                self.store.job(job_id).update(status="cancelled", ended_at=time.time())
        return self.describe(job_id)

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        proc = self.proc
        if proc is not None:
            self._signal(proc, signal.SIGKILL)
        self.thread.join(5)

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            proc.send_signal(sig)
            if sig == signal.SIGKILL:
                proc.send_signal(signal.SIGCONT)
        except (ProcessLookupError, OSError):
            pass

    def _serve(self, name: str, folder: str, base: str) -> None:
        if self.adapters.get(name) == folder:
            return
        self.adapters[name], self.bases[name] = folder, base
        try:
            self.serve(name, folder, base)
        except Exception as exc:  # noqa: BLE001 - serving is best effort; the folder stays on disk
            print(f"mlx_nb: could not serve adapter {name} ({exc})", file=sys.stderr)

    def _run(self) -> None:
        while not self.closed:
            self.wake.wait(0.5)
            self.wake.clear()
            with self.lock:
                job_id = self.queue.pop(0) if self.queue else None
                self.current = job_id
            if job_id is None:
                continue
            try:
                self._train(job_id)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the queue
                self._fail(job_id, f"{type(exc).__name__}: {exc}")
            finally:
                with self.lock:
                    self.current, self.proc = None, None

    def _fail(self, job_id: str, error: str) -> None:
        try:
            self.store.job(job_id).update(status="failed", error=error, ended_at=time.time())
        except (KeyError, OSError):
            pass

    def _train(self, job_id: str) -> None:
        from mlx_nb.jobs.manager import JobLock

        folder = self.store.job(job_id)
        lock = JobLock(folder)
        if not lock.acquire():  # another process runs it
            return
        try:
            for attempt in range(RESTARTS + 1):
                code = self._attempt(folder)
                record = folder.record()
                if job_id in self.cancelled:
                    folder.update(status="cancelled", ended_at=time.time())
                    return
                if code == 0 and record["status"] == "completed":
                    self._publish(folder)
                    return
                if code > 0 or self.closed:  # an error (its message is in the log), or we are shutting down
                    if not self.closed:
                        self._fail(job_id, _last_line(folder.path / "worker.log") or f"worker exited with {code}")
                    return
            self._fail(job_id, f"the worker was killed {RESTARTS + 1} times (out of memory?): see worker.log")
        finally:
            lock.release()

    def _attempt(self, folder: JobFolder) -> int:
        env = dict(os.environ)
        if self.threads:
            for key in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
                env[key] = str(self.threads)
        with open(folder.path / "worker.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "mlx_nb.training.worker", str(folder.path)],
                                    stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_child_setup(self.nice))
        with self.lock:
            self.proc = proc
        self._stopped, stopped_at, ran_at, published = False, 0.0, None, 0.0
        while proc.poll() is None:
            if self.closed:
                self._signal(proc, signal.SIGKILL)
                break
            now = time.monotonic()
            if not self.busy():
                if self._stopped:
                    self._signal(proc, signal.SIGCONT)
                    self._stopped = False
                ran_at = None
            elif self._stopped and now - stopped_at > self.hold_max_s:  # held long enough: its share
                self._signal(proc, signal.SIGCONT)
                self._stopped, ran_at = False, now
            elif not self._stopped and (ran_at is None or now - ran_at > self.share_s):
                self._signal(proc, signal.SIGSTOP)
                self._stopped, stopped_at = True, now
            if now - published > 0.5:
                self._publish(folder, final=False)
                published = now
            time.sleep(POLL_S)
        self._stopped = False
        return proc.wait()

    def _publish(self, folder: JobFolder, final: bool = True) -> None:
        """Serve each checkpoint (and at the end the adapter) not served yet."""
        root = folder.path / CHECKPOINTS
        if not final and not root.exists():
            return
        try:
            settings = folder.record()["settings"]
        except (OSError, ValueError, KeyError):
            return
        for adapter, path in self.served(folder.id).items():
            if final or adapter != settings["name"]:
                self._serve(adapter, path, settings["base"])


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


__all__ = ["TrainManager", "TrainingDataError", "TrainingError", "checkpoint_name"]
