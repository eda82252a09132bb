"""EngineLoop: everything the engine thread owns, and the thread's loop itself.

The loop never holds a reference to the `Engine` that created it. A notebook that re-runs
`eng = Engine(...)` drops the old Engine; its finalizer asks this loop to close, the loop leaves,
releases the model and the batch, and its worker thread goes back to the idle pool. Handles point
here too (their abort), so a handle kept in a variable does not keep a whole Engine alive.

MLX is touched by this thread only: model load, every batch step, memory policy, status reads.
Other threads talk to it through `commands`: ("submit", live), ("submit_all", [live, ...]: admitted
together), ("abort", id), ("call", fn, future), ("close",).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Optional

from mlx_nb.engine.events import EventLog
from mlx_nb.engine.types import first_line

log = logging.getLogger("mlx_nb.engine")


BURST_GAP_S = 0.05  # submits this close together, to an idle engine, start as one prompt batch
BURST_MAX_S = 0.25  # ... waiting at most this long for the rest of the burst (see Bursts)


class Bursts:
    """Whether an idle engine's first submit waits for the rest of a burst.

    Chats reaching an idle engine together (32 clients at once) are best read as one prompt batch,
    and a lone chat is best started at once; the first submit cannot tell which it is, the traffic
    can. When the last time the engine left idle brought a burst (more than one submit within
    BURST_MAX_S), the next time waits while submits keep arriving BURST_GAP_S apart, at most
    BURST_MAX_S; after a lone chat it does not wait. Measured against llama-server in bench/: 32
    at once get their first token ~0.3 s sooner; chats one at a time pay nothing (the first one
    after a burst pays one BURST_GAP_S)."""

    def __init__(self):
        self.left_idle = float("-inf")
        self.count = 0  # submits within BURST_MAX_S of leaving idle

    def leave_idle(self, now: float) -> float:
        """A submit woke the idle engine: until when to wait for more submits (0.0: don't)."""
        bursty = self.count > 1
        self.left_idle, self.count = now, 0
        return now + BURST_MAX_S if bursty else 0.0

    def submitted(self, now: float) -> None:
        if now - self.left_idle <= BURST_MAX_S:
            self.count += 1


class EngineClosedError(RuntimeError):
    pass


def _submitted(cmd: tuple) -> list:
    """The requests a command queues (none for the other commands)."""
    return list(cmd[1]) if cmd[0] == "submit_all" else [cmd[1]] if cmd[0] == "submit" else []


def _interactive(cmd: tuple) -> list:
    """The requests a command queues that are not a dataset job's rows (those never make a burst)."""
    return [live for live in _submitted(cmd) if not live.extra.get("job")]


class EngineLoop:
    def __init__(self, model_name: str, config, event_log: EventLog, load_progress=None):
        self.model_name = model_name
        self.config = config  # the Engine's EngineConfig (engine/config.py)
        self.event_log = event_log
        self.load_progress = load_progress  # a models.progress.LoadProgress the loader reports into
        self.policy = None  # how the model batches (engine/batch/batchability.py), set at load
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.ready = threading.Event()
        self.load_error: Optional[BaseException] = None
        self.loaded = None
        self.runner = None
        self.prefills = None  # a vision model's requests waiting for or in their prefill (VisionPrefills)
        self.memory = None  # MemoryPolicy, set at load
        self.kv, self.kv_note = None, None  # the KV quantization in use, and why not if one was asked for
        self.draft_note = None  # why the draft model asked for is not used (engine/speculation/draft.py)
        self.snapshots = False  # set at load: whether prompts are cut at segment ends for prefix snapshots
        self.runtime: Optional[dict] = None  # read on the engine thread: it asks MLX for the device
        self.thread: Optional[threading.Thread] = None
        self.bursts = Bursts()
        self.stopped = False  # the thread has left its loop; guarded by stop_lock
        self.stop_lock = threading.Lock()
        self.closing = False

    # -- the engine thread -------------------------------------------------------------------
    def run(self) -> None:
        from mlx_nb.models.progress import LoadProgress, reporting

        self.thread = threading.current_thread()
        progress = self.load_progress or LoadProgress()
        try:
            with reporting(progress):
                self._load()
        except BaseException as exc:  # reported to every caller through Engine.wait_ready()
            from mlx_nb.models.loaded import ModelLoadError

            self.load_error = exc if isinstance(exc, ValueError) else ModelLoadError(
                f"could not load {self.model_name}: {type(exc).__name__}: {first_line(exc)}"
            )
            progress.finish("failed")
            self.ready.set()
            self._release()
            return
        progress.finish("ready")
        self.ready.set()
        try:
            self._serve()
        finally:  # closed, or an unexpected error: nobody may be left waiting
            with self.stop_lock:
                self.stopped = True
            for part in (self.runner, self.prefills):
                try:
                    if part is not None:
                        part.close()
                except Exception as exc:
                    log.exception("mlx_nb: closing the batch failed: %s", first_line(exc))
            self.refuse_pending()
            self._spill_all()
            self._release()

    def _load(self) -> None:
        from mlx_nb.engine.batch.batchability import after_check, needs_check, policy_for, refusal
        from mlx_nb.engine.caches.kv_quant import kv_setting
        from mlx_nb.engine.caches.layout import always_trimmable
        from mlx_nb.engine.caches.prefix import PrefixCache
        from mlx_nb.engine.scheduling.memory import MemoryPolicy
        from mlx_nb.engine.scheduling.scheduler import BatchRunner
        from mlx_nb.models import ModelLoadError, load_model
        from mlx_nb.runtime import runtime_info

        self.runtime = runtime_info()
        cfg = self.config
        loaded = load_model(self.model_name, quantize=cfg.quantize)
        self.policy = policy_for(loaded, cfg.batch_policy)
        if loaded.kind == "text" and needs_check(self.policy, loaded.make_cache()):
            from mlx_nb.engine.batch.batch_probe import cached_check
            from mlx_nb.models.progress import report

            report("checking batched prefill on this model's weights")
            self.policy = after_check(self.policy, cached_check(loaded))
        if self.policy.mode == "refused":
            raise ModelLoadError(refusal(self.model_name, self.policy))
        self.loaded = loaded
        self.memory = MemoryPolicy(loaded, memory_limit=cfg.memory_limit, buffer_cache_bytes=cfg.buffer_cache_bytes)
        self.kv, self.kv_note = kv_setting(loaded, cfg.kv_bits, cfg.kv_group_size)
        if self.kv_note:
            log.warning("mlx_nb: %s: KV cache stays float: %s", self.model_name, self.kv_note)
        # Snapshots at segment ends (system prompt, conversation before the reply) are how a model
        # whose cache can't be cut back (SSM state, a wrapped window) finds the next turn's prefix.
        # Plain KV caches are trimmed back from any stored entry instead: no snapshot (each one is
        # an extra prefill step and a cache copy per request).
        # The sequential lane starts every request from an empty cache: no prefix reuse there.
        reuse = cfg.prefix_cache and self.policy.mode != "sequential"
        self.snapshots = reuse and not all(always_trimmable(c) for c in loaded.make_cache())
        drafter = None
        if cfg.draft_model and cfg.speculation:
            from mlx_nb.engine.speculation.draft import load_draft

            drafter, self.draft_note = load_draft(loaded, cfg.draft_model)
            if self.draft_note:
                log.warning("mlx_nb: %s: %s", self.model_name, self.draft_note)
            else:  # held beside the model's weights: the registry's budget and the prefix budget count it
                self.memory.draft_weights = drafter.weights_bytes
        prefix = None
        if reuse:
            budget = self.memory.prefix_budget(cfg.prefix_cache_bytes)
            prefix = PrefixCache(self.model_name, budget, disk=self._disk_store(loaded))
        self.runner = BatchRunner(loaded, self.event_log, prefix=prefix, policy=self.policy, kv=self.kv,
                                  drafter=drafter, draft_note=self.draft_note, max_batch=cfg.max_batch,
                                  prefill_batch=cfg.prefill_batch, prefill_step_size=cfg.prefill_step_size,
                                  prefill_budget_s=cfg.prefill_budget_s, speculation=cfg.speculation,
                                  job_rows_under_load=cfg.job_rows_under_load, job_batch=cfg.job_batch)
        if loaded.kind == "vision" and self.policy.mode != "sequential":  # else the lane reads the images
            from mlx_nb.engine.scheduling.vision_prefill import VisionPrefills

            self.prefills = VisionPrefills(loaded, self.event_log, self.runner, cfg.prefill_step_size,
                                           cfg.prefill_budget_s)

    def _disk_store(self, loaded):
        """The prefix cache's folder on disk for this model's weights, if one was asked for."""
        folder = self.config.prefix_cache_dir
        if not folder:
            return None
        from mlx_nb.engine.batch.batch_probe import fingerprint
        from mlx_nb.engine.caches.kv_quant import fresh_cache, upstream_form
        from mlx_nb.engine.caches.prefix_disk import DiskPrefixStore, layer_classes

        classes = layer_classes(upstream_form(fresh_cache(loaded, self.kv)))
        if classes is None:  # a cache mlx_lm cannot rebuild from a file (a vision model's own class)
            log.info("mlx_nb: %s's cache cannot be saved to disk; its prefix cache stays in memory", self.model_name)
            return None
        mark = fingerprint(loaded) + ("" if self.kv is None else "-" + self.kv.label)  # float and quantized apart
        return DiskPrefixStore(folder, mark, classes, self.config.prefix_cache_disk_bytes, kv=self.kv)

    def _spill(self) -> bool:
        """Idle: write one prefix-cache entry to disk; whether there may be more."""
        prefix = self.runner.prefix
        try:
            return prefix is not None and prefix.spill_one()
        except Exception as exc:  # serving goes on; the entry stays in memory only
            log.exception("mlx_nb: writing a prefix-cache entry failed: %s", first_line(exc))
            return False

    def _spill_all(self) -> None:
        """Closing: what the prefix cache stored since its last write goes to disk, for the next start."""
        prefix = self.runner.prefix if self.runner is not None else None
        try:
            if prefix is not None:
                prefix.spill_all()
        except Exception as exc:
            log.exception("mlx_nb: saving the prefix cache at close failed: %s", first_line(exc))

    def _serve(self) -> None:
        runner, prefills = self.runner, self.prefills
        while True:
            idle = not (runner.active or prefills)
            spilled = idle and self._spill()  # wrote to disk: look for commands again before waiting
            try:
                cmd = self.commands.get(block=idle and not spilled)
            except queue.Empty:
                cmd = None
            starts = idle and cmd is not None and bool(_interactive(cmd))
            burst_end = self.bursts.leave_idle(time.monotonic()) if starts else 0.0
            while cmd is not None:
                for _ in _interactive(cmd):
                    self.bursts.submitted(time.monotonic())
                if not self._handle(cmd):
                    return
                try:
                    cmd = self.commands.get_nowait()
                except queue.Empty:
                    cmd = None
                    wait = min(BURST_GAP_S, burst_end - time.monotonic())
                    if wait > 0:
                        try:
                            cmd = self.commands.get(timeout=wait)
                        except queue.Empty:
                            cmd = None
            if runner.active:
                try:  # job rows fill the slots interactive requests leave (engine/scheduling/background.py)
                    runner.balance()
                except Exception as exc:  # as a failed step: the batch's requests fail, the engine goes on
                    runner._recover(exc)
            if runner.by_uid:
                runner.step()
                self.memory.after_step(runner)
            if prefills:  # one vision prefill chunk between batch steps
                prefills.step()
            if not runner.active and not prefills:  # idle (the last request ended): give buffers back
                self.memory.settle()

    def _handle(self, cmd: tuple) -> bool:
        kind = cmd[0]
        if kind == "submit_all":  # admitted in one go: nothing runs a step between them
            return all(self._handle(("submit", live)) for live in cmd[1])
        if kind == "submit":
            live = cmd[1]
            if live.handle.done:  # aborted before it was admitted
                return True
            try:
                if live.extra.get("job") and self.prefills is None:  # a dataset job's row: it waits its turn
                    self.runner.queue_background(live)
                elif self.prefills is not None:  # prefilled alone, then its cache MOVES into the batch
                    self.prefills.add(live)
                else:
                    self.runner.admit(live)
            except Exception as exc:
                live.finish("error", error=f"could not start the request: {type(exc).__name__}: {first_line(exc)}")
        elif kind == "abort":
            try:
                if not self.runner.abort(cmd[1]) and self.prefills is not None:
                    self.prefills.abort(cmd[1])
            except Exception as exc:  # the runner recovers on its next step; the abort is logged
                log.exception("mlx_nb: abort of %s failed: %s", cmd[1], first_line(exc))
        elif kind == "call":
            fn, fut = cmd[1], cmd[2]
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)
        elif kind == "close":
            return False
        return True

    def _release(self) -> None:
        """Drop the model and the batch, and give MLX's buffer cache back: a closed engine holds nothing."""
        import gc

        self.runner = self.prefills = None
        self.loaded = None
        gc.collect()  # the batch's objects form cycles: free their arrays now, not at some later collection
        try:
            import mlx.core as mx

            mx.clear_cache()
        except Exception:
            pass

    def refuse_pending(self) -> None:
        """Commands that raced with close: their callers must not wait forever."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            for live in _submitted(cmd):
                live.finish("abort", error="the engine was closed before this request started")
            if cmd[0] == "call":
                cmd[2].set_exception(EngineClosedError("the engine is closed"))

    # -- other threads -----------------------------------------------------------------------
    @property
    def on_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run `fn` on the engine thread between two steps and return its result."""
        if self.on_thread:
            return fn()
        fut: Future = Future()
        with self.stop_lock:
            if self.stopped or self.closing:
                raise EngineClosedError("the engine is closed: create a new Engine")
            self.commands.put(("call", fn, fut))
        try:
            return fut.result(timeout)
        except FutureTimeout:
            raise TimeoutError(
                f"the engine thread did not answer within {timeout:.0f} s (a long prefill?): try again"
            ) from None

    def submit(self, live) -> None:
        """Queue an admitted-at-submit request, or end it at once if the loop has stopped."""
        with self.stop_lock:
            if not self.stopped:
                self.commands.put(("submit", live))
                return
        live.finish("abort", error="the engine was closed before this request started")

    def submit_all(self, lives: list) -> None:
        """Queue requests to be admitted together, at one step (or end them all if the loop has stopped)."""
        with self.stop_lock:
            if not self.stopped:
                self.commands.put(("submit_all", list(lives)))
                return
        for live in lives:
            live.finish("abort", error="the engine was closed before this request started")

    def abort(self, request_id: str) -> None:
        if not self.closing:
            self.commands.put(("abort", request_id))

    def close(self) -> None:
        """Ask the thread to leave (idempotent; also what a dropped Engine's finalizer calls)."""
        with self.stop_lock:
            if self.closing:
                return
            self.closing = True
        self.commands.put(("close",))
