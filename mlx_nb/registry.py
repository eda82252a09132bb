"""Several models on one server: each its own Engine (its own batch), loaded when a request names it,
kept inside a memory budget, unloaded when idle.

What may be served is named up front (`entries`: a name and what `Engine` loads: a built-in name, a
model directory, a `.gguf` file, a hub id), so a request cannot make the server load an arbitrary
path. The default model is registered pinned: never unloaded.

The budget counts what a loaded model may hold: its weights (a draft model's included) plus its
prefix cache's byte budget (the cache grows up to it). Before a load, the model's size is estimated
from its files; loading past the budget first unloads the least recently used idle models, and a
model that still cannot fit (too big, or the others are busy) is refused with a message saying why
and what to change; nothing is loaded to find out. Engines share the process's kernel thread pool (one job at a time),
so two models stepping at once take turns on the cores rather than oversubscribing them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_nb.formatting import human_bytes
from mlx_nb.models.adapters import is_adapter_dir

SCAN_SUFFIXES = (".gguf",)


class ModelUnavailable(RuntimeError):
    """A registered model that cannot be loaded now (the budget); the message says why and what to do."""


@dataclass
class Entry:
    name: str  # what requests name
    source: str  # what Engine() loads
    pinned: bool = False
    engine: Any = None
    last_used: float = 0.0
    estimate: Optional[int] = None  # bytes its files take, before it is loaded
    unloaded: int = 0  # times it was unloaded (idle or for room)
    keep_alive_s: Optional[float] = None  # the last request's keep_alive (None: the server's; < 0: forever)

    @property
    def state(self) -> str:
        e = self.engine
        if e is None:
            return "available"
        if e.load_error is not None:
            return "failed"
        return "loaded" if e.ready else "loading"


def entries_from(specs: list[str]) -> dict[str, str]:
    """`name=source`, a source (named by its folder or file stem), or a folder of models to scan
    (each model directory in it, each .gguf file) -> {name: source}. LoRA adapter folders are not
    models: `adapters_from` reads them from the same specs."""
    out: dict[str, str] = {}
    for spec in specs:
        name, source, path = _named(spec)
        if is_adapter_dir(path):
            continue
        if not name and path.is_dir() and not (path / "config.json").is_file():
            for child in sorted(path.iterdir()):
                if (child / "config.json").is_file() or child.suffix.lower() in SCAN_SUFFIXES:
                    out.setdefault(child.stem if child.is_file() else child.name, str(child))
            continue
        if not name:
            name = path.stem if path.suffix.lower() in SCAN_SUFFIXES else (path.name if path.exists() else source)
        out[name.strip()] = source.strip()
    return out


def _named(spec: str) -> tuple[str, str, Path]:
    """A `name=source` or bare `source` spec: (name or "", source, its path)."""
    name, _, source = spec.partition("=") if "=" in spec else ("", "", spec)
    return name, source, Path(source).expanduser()


def adapters_from(specs: list[str]) -> dict[str, str]:
    """The mlx_lm LoRA adapter folders among `specs` (`name=folder`, a folder named by itself, or
    a folder holding adapter folders) -> {name: folder}. Requests name one as `model@adapter`."""
    out: dict[str, str] = {}
    for spec in specs:
        name, _, path = _named(spec)
        if is_adapter_dir(path):
            out[(name or path.name).strip()] = str(path)
        elif not name and path.is_dir():
            for child in sorted(path.iterdir()):
                if is_adapter_dir(child):
                    out.setdefault(child.name, str(child))
    return out


def split_adapter(name: Optional[str], field: Any = None) -> tuple[Optional[str], Optional[str]]:
    """A request's (model, adapter): `model@adapter` in its model name, or its `adapter` field."""
    adapter = field if isinstance(field, str) and field else None
    if name and "@" in name:
        name, _, adapter = name.rpartition("@")
    return name or None, adapter


def keep_alive_seconds(value: Any) -> Optional[float]:
    """A request's `keep_alive`, as Ollama reads it: seconds (a number), a duration ("90s", "5m",
    "1h"), 0 to unload once idle, a negative value to keep loaded; None if not given. ValueError
    (with what to send) for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("keep_alive must be seconds or a duration such as '5m', not true/false")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().lower()
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * units[unit]
            except ValueError:
                break
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"keep_alive must be seconds or a duration such as '5m' or '1h', not {value!r}") from None


def estimate_bytes(source: str) -> Optional[int]:
    """What a model's weights take, from its files (None when they are not local yet)."""
    path = Path(source).expanduser()
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors")) or None
    if source.startswith("tiny-"):  # the built-in test fixtures: built in a moment, then measured
        from mlx_nb.models.sources import resolve

        try:
            return estimate_bytes(str(resolve(source)))
        except ValueError:
            return None
    return None


def with_draft(estimate: Optional[int], draft: Optional[str]) -> Optional[int]:
    """A model's estimate with its draft model's files added (a draft not on disk yet adds nothing
    until it is loaded and measured)."""
    if estimate is None or not draft:
        return estimate
    return estimate + (estimate_bytes(draft) or 0)


class ModelRegistry:
    """The models one server may serve and the engines of those loaded; thread-safe."""

    def __init__(self, entries: dict[str, str], make_engine: Callable[[str], Any], budget_bytes: int,
                 keep_alive_s: float, prefix_bytes: Callable[[Any], int], clock: Callable[[], float] = time.monotonic,
                 adapters: Optional[dict[str, str]] = None, drafts: Optional[dict[str, str]] = None):
        # a model's estimate counts its draft model's files too (drafts: name -> the draft's source)
        self.entries = {name: Entry(name, source, estimate=with_draft(estimate_bytes(source), (drafts or {}).get(name)))
                        for name, source in entries.items()}
        self.adapters = dict(adapters or {})  # name -> folder: LoRA adapters a request may name (model@adapter)
        self.adapter_lock = threading.Lock()
        self.make_engine = make_engine
        self.budget_bytes = int(budget_bytes)
        self.keep_alive_s = keep_alive_s
        self.prefix_bytes = prefix_bytes  # an engine -> its prefix cache's byte budget
        self.clock = clock
        self.lock = threading.RLock()

    def pin(self, name: str, engine) -> None:
        """The default model: registered with its engine, never unloaded."""
        with self.lock:
            entry = self.entries.pop(name, None) or Entry(name, engine.model_name)
            entry.engine, entry.pinned, entry.last_used = engine, True, self.clock()
            self.entries = {name: entry, **self.entries}  # listed first

    def names(self) -> list[str]:
        return list(self.entries)

    def entry(self, name: Optional[str]) -> Optional[Entry]:
        return self.entries.get(name) if name else None

    # -- memory ------------------------------------------------------------------------------
    def reserved(self, entry: Entry) -> int:
        """What a model counts against the budget: its weights (measured once loaded) and its prefix cache's budget."""
        e = entry.engine
        if e is not None and e.loaded is not None:
            return e.weights_bytes + e.adapter_bytes + self.prefix_bytes(e)
        return int((entry.estimate or 0) * 1.05) + self.prefix_bytes(e)

    def used_bytes(self) -> int:
        return sum(self.reserved(e) for e in self.entries.values() if e.engine is not None)

    # -- loading and unloading -----------------------------------------------------------------
    def engine_for(self, name: str):
        """The model's engine, loading it (making room first) if it is not; ModelUnavailable if it cannot fit."""
        unloading = []
        with self.lock:
            entry = self.entries[name]
            entry.last_used = self.clock()
            if entry.engine is not None and entry.engine.load_error is None and not entry.engine.closed:
                return entry.engine
            entry.engine = None
            need = self.reserved(entry)  # its files, and its prefix cache's budget
            if need > self.budget_bytes:
                raise ModelUnavailable(
                    f"model {name} needs about {human_bytes(need)} (weights and prefix cache), more than the whole "
                    f"memory budget of {human_bytes(self.budget_bytes)}: raise MLXExtension.memory_budget or serve "
                    "a smaller file")
            for victim in self._room_for(need):
                unloading.append(victim.engine)
                victim.engine, victim.unloaded = None, victim.unloaded + 1
            if need + self.used_bytes() > self.budget_bytes:
                held = ", ".join(e.name for e in self.entries.values() if e.engine is not None)
                raise ModelUnavailable(
                    f"model {name} needs about {human_bytes(need)} and the memory budget "
                    f"({human_bytes(self.budget_bytes)}) is held by models that are busy or pinned ({held}): "
                    "retry when they are idle, or raise MLXExtension.memory_budget")
            entry.engine = self.make_engine(entry.source)
        for engine in unloading:  # outside the lock: closing joins the engine's thread
            engine.close()
        return entry.engine

    def _room_for(self, need: int) -> list[Entry]:
        """Idle, unpinned loaded models to unload, least recently used first, until `need` fits."""
        free = self.budget_bytes - self.used_bytes()
        out = []
        for entry in sorted(self.entries.values(), key=lambda e: e.last_used):
            if free >= need:
                break
            if entry.engine is not None and not entry.pinned and entry.engine.idle:
                out.append(entry)
                free += self.reserved(entry)
        return out if free >= need else []

    def touch_busy(self) -> None:
        """A model that is decoding counts as used now (its keep-alive runs from when it goes idle)."""
        now = self.clock()
        for entry in self.entries.values():
            if entry.engine is not None and not entry.engine.idle:
                entry.last_used = now

    def sweep(self) -> list[str]:
        """Unload the models idle for longer than the keep-alive; their names."""
        closing = []
        with self.lock:
            self.touch_busy()
            now = self.clock()
            for entry in self.entries.values():
                e = entry.engine
                if e is None or entry.pinned:
                    continue
                keep = self.keep_alive_s if entry.keep_alive_s is None else entry.keep_alive_s
                expired = keep >= 0 and now - entry.last_used > keep
                if e.load_error is not None or (e.idle and e.ready and expired):
                    closing.append((entry.name, e))
                    entry.engine = None
                    entry.unloaded += e.load_error is None
        for _, engine in closing:
            engine.close()
        return [name for name, _ in closing]

    def keep_alive(self, name: str, seconds: Optional[float]) -> None:
        """A request's keep_alive for its model: from now on, how long it stays loaded once idle."""
        if seconds is not None:
            with self.lock:
                self.entries[name].keep_alive_s = seconds

    def unload(self, name: str) -> bool:
        """Unload a model now (not the pinned default); whether it was loaded."""
        with self.lock:
            entry = self.entries[name]
            if entry.pinned or entry.engine is None:
                return False
            engine, entry.engine = entry.engine, None
            entry.unloaded += 1
        engine.close()
        return True

    # -- adapters ------------------------------------------------------------------------------
    def adapter_on(self, engine, name: str) -> dict:
        """Registered adapter `name` on `engine`, read from its folder the first time that engine
        needs it (again after the model was unloaded and loaded). KeyError if not registered."""
        path = self.adapters[name]
        with self.adapter_lock:  # two requests naming it at once read it once
            have = {a["name"]: a for a in engine.adapters()}
            return have[name] if name in have else engine.load_adapter(name, path)

    def close(self) -> None:
        with self.lock:
            engines = [e.engine for e in self.entries.values() if e.engine is not None and not e.pinned]
            for e in self.entries.values():
                if not e.pinned:
                    e.engine = None
        for engine in engines:
            engine.close()

    def describe(self) -> list[dict]:
        """Each model: its name, state, what it holds (or is estimated to), whether pinned, why it failed."""
        with self.lock:
            out = []
            for entry in self.entries.values():
                e = entry.engine
                card = {"name": entry.name, "state": entry.state, "pinned": entry.pinned,
                        "reserved_bytes": self.reserved(entry) if e is not None else None,
                        "estimated_bytes": entry.estimate, "unloaded": entry.unloaded,
                        "keep_alive_s": self.keep_alive_s if entry.keep_alive_s is None else entry.keep_alive_s,
                        "idle_s": round(self.clock() - entry.last_used, 1) if e is not None else None}
                if entry.state == "loading":
                    card["load"] = e.load_progress.to_dict()
                if entry.state == "failed":
                    card["error"] = str(e.load_error)
                out.append(card)
            return out

    def status(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "used_bytes": self.used_bytes(),
                "keep_alive_s": self.keep_alive_s, "models": self.describe()}
