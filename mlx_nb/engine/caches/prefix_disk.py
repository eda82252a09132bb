"""Prefix-cache entries kept on disk, so a restarted server skips the prompts it read before.

One folder per model, named by its weights' fingerprint (`batch_probe.fingerprint`): two servers of
the same weights share entries, and another model's never reach this one. Each entry is one
`.safetensors` file in mlx_lm's prompt-cache format (`save_prompt_cache`: the layers' states plus
their class names), with three fields of our own in its metadata: the format, the fingerprint and
the token ids the cache holds.

Why files are checked twice: the folder is read at start from the files' headers only (cheap,
nothing loaded), and a file is read whole only when a lookup wants it. Either time, a file that is
truncated, not ours, of another model or whose layers do not match this model's cache is ignored
with a warning and never loaded; a broken file of ours is deleted.

Writes are atomic (a hidden temporary file, then `os.replace`) and happen on the engine thread
(MLX's arrays are thread-local), only while no request runs or at close: a save never stalls a
decode step. The byte budget is kept by deleting the least recently used files (modification time,
touched on every read).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger("mlx_nb.engine")

FORMAT = "mlx-nb-prefix/1"
SUFFIX = ".safetensors"
MAX_HEADER = 64 * 2**20  # a safetensors header longer than this is not one we wrote
DEFAULT_DISK_BYTES = 4 * 2**30
# Token arrays are compared as bytes: 4 little-endian bytes a token on every machine we write them.
TOKEN = "<I"


def default_folder() -> str:
    """Where a server keeps its prefix cache unless told: $MLX_NB_PREFIX_CACHE_DIR ('' for none),
    else the prefix-cache folder under $MLX_NB_HOME."""
    from mlx_nb.models.sources import home

    return os.environ.get("MLX_NB_PREFIX_CACHE_DIR", str(home() / "prefix-cache"))


def default_disk_budget(folder: Path) -> int:
    """4 GiB, or a tenth of the free space where the folder lives if that is less."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return DEFAULT_DISK_BYTES
    return min(DEFAULT_DISK_BYTES, free // 10)


def token_bytes(tokens) -> bytes:
    data = array("I", tokens)
    if data.itemsize != 4 or struct.pack("=I", 1) != struct.pack(TOKEN, 1):  # fixed layout on disk
        return struct.pack(f"<{len(tokens)}I", *tokens)
    return data.tobytes()


def common_tokens(a: bytes, b: bytes) -> int:
    """How many leading tokens two token-byte strings share (binary search on slices: C speed)."""
    lo, hi = 0, min(len(a), len(b)) // 4
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: 4 * mid] == b[: 4 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class BadEntry(ValueError):
    """A file that must not be loaded; `broken` says whether it is damaged (else: not this model's)."""

    def __init__(self, message: str, broken: bool):
        super().__init__(message)
        self.broken = broken


def read_metadata(path: Path) -> dict:
    """The file's safetensors metadata, after checking the header describes exactly the file's bytes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise BadEntry("shorter than a safetensors header", broken=True)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise BadEntry("its header length is impossible", broken=True)
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise BadEntry("its header is not JSON", broken=True) from None
    if not isinstance(header, dict):
        raise BadEntry("its header is not a table", broken=True)
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if 8 + n + max(ends, default=0) != size:
        raise BadEntry("truncated (its tensors do not end where the file does)", broken=True)
    meta = header.get("__metadata__") or {}
    return meta if isinstance(meta, dict) else {}


def _field(meta: dict, name: str) -> Optional[str]:
    """Our field in mlx_lm's flattened metadata ([ours, classes, scalars] -> "0.<name>")."""
    return meta.get(f"0.{name}")


@dataclass
class DiskEntry:
    path: Path
    tokens: bytes  # token ids, TOKEN-packed
    nbytes: int
    trimmable: bool

    @property
    def length(self) -> int:
        return len(self.tokens) // 4

    def token_list(self) -> list[int]:
        return list(struct.unpack(f"<{self.length}I", self.tokens))


def describe(meta: dict, fingerprint: str) -> tuple[bytes, bool]:
    """(tokens, trimmable) of an entry's metadata, or BadEntry if it is not this model's entry."""
    if _field(meta, "mlx_nb_format") != FORMAT:
        raise BadEntry(f"not an mlx-nb prefix-cache file (format {_field(meta, 'mlx_nb_format')!r})", broken=False)
    if _field(meta, "mlx_nb_fingerprint") != fingerprint:
        raise BadEntry("written for other weights (fingerprint differs)", broken=False)
    try:
        tokens = base64.b64decode(_field(meta, "mlx_nb_tokens") or "", validate=True)
    except ValueError:
        raise BadEntry("its token list is not base64", broken=True) from None
    if not tokens or len(tokens) % 4:
        raise BadEntry("its token list is empty or cut", broken=True)
    return tokens, _field(meta, "mlx_nb_trimmable") == "1"


def layer_classes(cache: list) -> Optional[list]:
    """Each layer's mlx_lm class name (nested for CacheList), or None if a layer is not an mlx_lm
    cache class (a vision model's own cache): mlx_lm's loader could not rebuild it."""
    import mlx_lm.models.cache as upstream

    out = []
    for layer in cache:
        name = type(layer).__name__
        if getattr(upstream, name, None) is not type(layer):
            return None
        members = getattr(layer, "caches", None)
        if members is not None:
            inner = layer_classes(members)
            if inner is None:
                return None
            out.append([name, inner])
        else:
            out.append(name)
    return out


def _sizes(cache: list) -> list:
    """What each layer holds, in tokens, where a layer says (`size()`): a loaded entry must hold its tokens."""
    out = []
    for layer in cache:
        members = getattr(layer, "caches", None)
        if members is not None:
            out.extend(_sizes(members))
        elif callable(getattr(layer, "size", None)) and type(layer).__name__ == "KVCache":
            out.append(layer.size())
    return out


class DiskPrefixStore:
    """The entries of one model's folder: looked up by token prefix, read and written on the engine thread."""

    def __init__(self, root: Path, fingerprint: str, classes: list, max_bytes: Optional[int] = None,
                 min_tokens: int = 128, kv=None):
        self.fingerprint = fingerprint
        self.kv = kv  # a KVQuantization: entries are quantized caches, written as mlx_lm's QuantizedKVCache
        self.folder = Path(root).expanduser() / fingerprint
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.classes = classes  # a fresh cache's layer classes: a loaded entry must have these
        self.max_bytes = default_disk_budget(self.folder) if max_bytes is None else int(max_bytes)
        self.min_tokens = min_tokens
        self.entries: dict[str, DiskEntry] = {}
        self.counts = {"written": 0, "read": 0, "ignored": 0, "deleted": 0, "evicted": 0}
        self.scan()

    # -- the folder ------------------------------------------------------------------------
    def scan(self) -> None:
        """Index the folder's entries from their headers; stale temporary files are removed."""
        self.entries.clear()
        for path in sorted(self.folder.iterdir()):
            if path.name.startswith("."):
                if path.name.endswith(".tmp" + SUFFIX) and f".{os.getpid()}." not in path.name:
                    path.unlink(missing_ok=True)  # a write cut short by a crash
                continue
            if path.suffix != SUFFIX or not path.is_file():
                continue
            try:
                tokens, trimmable = describe(read_metadata(path), self.fingerprint)
            except (OSError, BadEntry) as exc:
                self._ignore(path, exc)
                continue
            self.entries[path.name] = DiskEntry(path, tokens, path.stat().st_size, trimmable)
        self._evict()

    def _ignore(self, path: Path, exc: Exception) -> None:
        self.counts["ignored"] += 1
        log.warning("mlx_nb: ignoring prefix-cache file %s: %s", path, exc)
        self.entries.pop(path.name, None)
        if isinstance(exc, BadEntry) and exc.broken:
            path.unlink(missing_ok=True)
            self.counts["deleted"] += 1

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def _evict(self, keep: Optional[str] = None) -> None:
        """Delete the least recently used entries until the folder fits its budget."""
        by_age = sorted(self.entries.values(), key=lambda e: _mtime(e.path))
        total = self.nbytes
        for entry in by_age:
            if total <= self.max_bytes:
                break
            if entry.path.name == keep:
                continue
            self._remove(entry)
            total -= entry.nbytes
            self.counts["evicted"] += 1

    def _remove(self, entry: DiskEntry) -> None:
        self.entries.pop(entry.path.name, None)
        entry.path.unlink(missing_ok=True)

    def clear(self) -> int:
        """Delete every entry of this model; returns the bytes they held."""
        held = self.nbytes
        for entry in list(self.entries.values()):
            self._remove(entry)
        return held

    # -- lookups -----------------------------------------------------------------------------
    def best(self, tokens: list[int]) -> tuple[Optional[DiskEntry], int]:
        """The entry that gives the longest usable prefix of `tokens`, and how many tokens it gives:
        an entry that is a prefix of them whole, or (a trimmable cache) cut back to what they share."""
        want = token_bytes(tokens)
        found, usable = None, 0
        for entry in self.entries.values():
            if entry.tokens[:4] != want[:4]:
                continue
            common = common_tokens(entry.tokens, want)
            if common == entry.length:
                n = common
            elif entry.trimmable:
                n = min(common, len(tokens) - 1)  # as mlx_lm's LRU trims: at least one token left to read
            else:
                n = 0
            if n > usable:
                found, usable = entry, n
        return found, usable

    def read(self, entry: DiskEntry) -> Optional[list]:
        """The entry's cache, checked against this model and evaluated; None (with a warning) if unusable."""
        import mlx.core as mx
        from mlx_lm.models.cache import load_prompt_cache

        try:
            tokens, _ = describe(read_metadata(entry.path), self.fingerprint)
            if tokens != entry.tokens:
                raise BadEntry("its tokens changed since the folder was read", broken=False)
            cache = load_prompt_cache(str(entry.path))
            if layer_classes(cache) != self.classes:
                raise BadEntry("its layers are not this model's cache layers", broken=False)
            if any(size != entry.length for size in _sizes(cache)):
                raise BadEntry("its layers do not hold the tokens it names", broken=True)
            mx.eval([a for layer in cache for a in _arrays(layer)])
            if self.kv is not None:
                cache = self.kv.convert(cache)  # mlx_lm's QuantizedKVCache -> ours, which batches
        except (OSError, BadEntry) as exc:
            self._ignore(entry.path, exc)
            return None
        except Exception as exc:  # mlx_lm or MLX could not rebuild it: damaged
            self._ignore(entry.path, BadEntry(f"{type(exc).__name__}: {exc}", broken=True))
            return None
        os.utime(entry.path)  # most recently used
        self.counts["read"] += 1
        return cache

    # -- writes ------------------------------------------------------------------------------
    def covered(self, tokens: bytes, trimmable: bool) -> bool:
        """Whether an entry already gives these tokens (the same tokens, or a trimmable longer one)."""
        for entry in self.entries.values():
            if entry.tokens == tokens or (trimmable and entry.trimmable and entry.tokens.startswith(tokens)):
                return True
        return False

    def write(self, tokens: list[int], cache: list) -> bool:
        """Save one cache holding `tokens`; False if it is too short, already there or not savable."""
        from mlx_lm.models.cache import can_trim_prompt_cache, save_prompt_cache

        from mlx_nb.engine.caches.kv_quant import upstream_form

        cache = upstream_form(cache)
        if len(tokens) < self.min_tokens or layer_classes(cache) != self.classes:
            return False
        if sum(layer.nbytes for layer in cache) > self.max_bytes:
            return False
        packed = token_bytes(tokens)
        trimmable = bool(can_trim_prompt_cache(cache))
        if self.covered(packed, trimmable):
            return False
        name = hashlib.sha256(packed).hexdigest()[:32] + SUFFIX
        final = self.folder / name
        tmp = self.folder / f".{name[:-len(SUFFIX)]}.{os.getpid()}.tmp{SUFFIX}"
        meta = {"mlx_nb_format": FORMAT, "mlx_nb_fingerprint": self.fingerprint,
                "mlx_nb_tokens": base64.b64encode(packed).decode(), "mlx_nb_trimmable": "1" if trimmable else "0"}
        try:
            save_prompt_cache(str(tmp), cache, meta)
            os.replace(tmp, final)
        except OSError as exc:  # a full or read-only disk: serving goes on, the entry stays in memory only
            tmp.unlink(missing_ok=True)
            log.warning("mlx_nb: could not write prefix-cache file %s: %s", final, exc)
            return False
        if trimmable:  # a trimmable entry gives every prefix of itself: shorter ones only take space
            for entry in list(self.entries.values()):
                if entry.trimmable and packed.startswith(entry.tokens) and entry.tokens != packed:
                    self._remove(entry)
        self.entries[name] = DiskEntry(final, packed, final.stat().st_size, trimmable)
        self.counts["written"] += 1
        self._evict(keep=name)
        return True

    def status(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "entries": len(self.entries), "bytes": self.nbytes,
                "budget_bytes": self.max_bytes, "tokens": sum(e.length for e in self.entries.values()),
                **self.counts}


def _arrays(layer) -> list:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    return [a for _, a in tree_flatten(layer.state) if isinstance(a, mx.array)]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
