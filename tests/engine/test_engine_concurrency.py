"""64 requests from 8 threads and from asyncio tasks: all complete, and no MLX call is ever made
off the engine thread (checked with a profiler hook on every thread, not by trusting the code)."""

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from mlx_nb import Engine


class MLXCallWatcher:
    """Records which threads run MLX code while installed.

    MLX's functions are nanobind objects, invisible to profile hooks, so the hook watches the
    Python side instead: any function of mlx / mlx_lm / mlx_vlm (their tokenizer helpers excepted:
    pure Python) and any function of ours that names `mx` (mlx.core).
    """

    PACKAGES = (f"{os.sep}mlx{os.sep}", f"{os.sep}mlx_lm{os.sep}", f"{os.sep}mlx_vlm{os.sep}")
    PURE_PYTHON = ("tokenizer_utils.py",)

    def __init__(self):
        self.threads: dict[str, int] = {}
        self.samples: dict[str, str] = {}
        self._lock = threading.Lock()

    def _is_mlx(self, code) -> bool:
        path = code.co_filename
        if any(p in path for p in self.PACKAGES):
            return not path.endswith(self.PURE_PYTHON)
        return f"{os.sep}mlx_nb{os.sep}" in path and ("mx" in code.co_names or "mx" in code.co_varnames)

    def _hook(self, frame, event, arg):
        if event != "call" or not self._is_mlx(frame.f_code):
            return
        name = threading.current_thread().name
        with self._lock:
            self.threads[name] = self.threads.get(name, 0) + 1
            self.samples.setdefault(name, f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    def __enter__(self):
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


def test_64_requests_from_threads_and_asyncio_only_touch_mlx_on_the_engine_thread():
    with MLXCallWatcher() as watcher:
        engine = Engine("tiny-llama", max_batch=32, wait=True)
        # Engine threads are long-lived (and may predate the watcher): hook this one explicitly.
        engine._call(lambda: sys.setprofile(watcher._hook))
        try:
            engine_thread = engine._job.thread.name

            def worker(i):
                h = engine.submit(messages=[{"role": "user", "content": f"thread {i}"}], max_tokens=6)
                return "".join(d.text for d in h), h.result(), h.id

            async def one(i):
                h = engine.submit(messages=[{"role": "user", "content": f"task {i}"}], max_tokens=6)
                text = "".join([d.text async for d in h])
                return text, await h.aresult(), h.id

            async def main():
                return await asyncio.gather(*(one(i) for i in range(32)))

            # Both at once: 8 threads submit while an event loop on a ninth runs 32 tasks.
            start = threading.Barrier(2)
            with ThreadPoolExecutor(9) as pool:
                tasks = pool.submit(lambda: (start.wait(), asyncio.run(main()))[1])
                start.wait()
                threaded = list(pool.map(worker, range(32)))
                tasked = tasks.result()
            status, events = engine.status(), engine.events()
        finally:
            engine._call(lambda: sys.setprofile(None))
            engine.close()
    results = threaded + tasked
    assert len(results) == 64
    thread_ids, task_ids = {i for *_, i in threaded}, {i for *_, i in tasked}
    mixed = [e for e in events if e["kind"] == "step" and thread_ids & set(e["requests"]) and task_ids & set(e["requests"])]
    assert mixed, "thread and asyncio requests never decoded in the same step"
    for text, r, _id in results:
        assert r.finish_reason in ("length", "stop") and r.error is None
        assert text == r.text
    assert status["peak_batch_size"] >= 8, "concurrent requests should have shared the batch"
    assert watcher.threads.get(engine_thread, 0) > 0, "the watcher saw no MLX call at all: it is broken"
    off_thread = {t: n for t, n in watcher.threads.items() if t != engine_thread}
    assert not off_thread, f"MLX called off the engine thread: {off_thread} e.g. {watcher.samples}"
