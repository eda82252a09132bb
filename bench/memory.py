"""Peak resident memory of server processes, sampled while a workload runs (Linux /proc)."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` with its children (a server may fork workers), in bytes."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = [int(k) for k in kids]
    for k in list(out):
        out += _children(k)
    return out


class PeakRSS:
    """`with PeakRSS({name: pid}) as peak: ...` then `peak.bytes[name]`: the highest RSS seen."""

    def __init__(self, pids: dict, every: float = 0.2):
        self.pids, self.every = pids, every
        self.bytes = {name: 0 for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.bytes[name] = max(self.bytes[name], rss_bytes(pid))
            time.sleep(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
