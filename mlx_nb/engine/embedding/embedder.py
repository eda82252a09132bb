"""Embedder: one embedding model on its own thread, many requests' inputs in one forward.

The model is mlx-embeddings' module for its family (BERT for all-MiniLM-L6-v2), loaded from its
folder; its last hidden states are pooled and normalized as the model's own files say
(engine/embedding/files.py), not as the library's default (which is always mean pooling).

Tokenizing happens on the caller's thread (so a bad input is refused before it queues, with the
input's index and what to do); the model runs on one worker thread (engine/scheduling/workers.py,
as an Engine's loop: MLX work stays on one thread). That thread takes every input waiting, from
every request, and groups them by padded length (a power of two from 16 on): inputs of one
length run together, in forwards of at most `max_batch_tokens` tokens. Padding is masked out of
attention and pooling, and each input is padded to its own bucket whatever else is waiting, so an
input's vector is the same alone and in any batch (tests/engine/test_engine_embedding.py).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from mlx_nb.engine.embedding.files import DEFAULT_EMBEDDER, EmbedderUnavailable, Pooling, read_pooling, resolve
from mlx_nb.engine.scheduling import workers
from mlx_nb.engine.types import RequestError

MIN_BUCKET = 16


@dataclass
class Embeddings:
    vectors: np.ndarray  # (inputs, dimensions) float32, in the order given
    tokens: int  # tokens read, special tokens included (usage)


@dataclass
class _Work:
    ids: list[list[int]]
    future: Future


def bucket(length: int) -> int:
    """The padded length an input of `length` tokens runs at."""
    size = MIN_BUCKET
    while size < length:
        size *= 2
    return size


class Embedder:
    """`Embedder()` serves the default embedder (all-MiniLM-L6-v2); `Embedder(folder)` a
    sentence-transformers folder of a family mlx-embeddings runs. `embed(texts)` -> Embeddings."""

    def __init__(self, model: Optional[str] = None, *, max_batch_tokens: int = 8192, wait: bool = False):
        self.model_name = model or DEFAULT_EMBEDDER
        self.max_batch_tokens = max_batch_tokens
        self.folder: Path = resolve(model)
        self.pooling: Pooling = read_pooling(self.folder)  # refused here when the files do not say
        self.tokenizer = _tokenizer(self.folder)
        config = _json(self.folder / "config.json")
        limits = [n for n in (self.pooling.max_tokens, config.get("max_position_embeddings")) if n]
        self.max_tokens: int = min(limits) if limits else 512
        self.dimensions: int = int(config.get("hidden_size") or 0)
        self.vocab_size: int = int(config.get("vocab_size") or self.tokenizer.get_vocab_size())
        self.cls_id = self.tokenizer.token_to_id("[CLS]")
        self.sep_id = self.tokenizer.token_to_id("[SEP]")
        if self.cls_id is None or self.sep_id is None:
            raise EmbedderUnavailable(f"{self.model_name}: its tokenizer has no [CLS] and [SEP] tokens; only "
                                      "encoder (BERT-style) embedders are served so far")
        self._lock = threading.Lock()
        self._queue: "queue.SimpleQueue[Optional[_Work]]" = queue.SimpleQueue()
        self._ready = threading.Event()
        self._closed = False
        self._busy = 0
        self.load_error: Optional[BaseException] = None
        self.weights_bytes = 0
        self.forwards = 0  # forwards run: fewer than the requests when they shared them
        self._job = workers.start(self._run, name="mlx-nb-embedder")
        if wait:
            self.wait_ready()

    # -- the caller's side ----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.load_error is None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> bool:
        return self._busy == 0

    def wait_ready(self, timeout: Optional[float] = None) -> "Embedder":
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self.model_name} is still loading")
        if self.load_error is not None:
            raise EmbedderUnavailable(f"{self.model_name} could not be loaded: {self.load_error}")
        return self

    def tokenize(self, text: str) -> list[int]:
        """The text's token ids, without the special tokens `embed` adds."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def input_ids(self, inputs: list[Union[str, list[int]]], truncate: bool = False) -> list[list[int]]:
        """Each input as the ids the model reads ([CLS] ... [SEP]); an input longer than the model
        reads is cut when `truncate`, else a RequestError naming it and the limit."""
        if not isinstance(inputs, list) or not inputs:
            raise RequestError("input must be a string or a non-empty list of strings or of token id lists", "input")
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                ids = self.tokenize(item)
            elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                bad = [t for t in item if not 0 <= t < self.vocab_size]
                if bad:
                    raise RequestError(f"input[{i}] has token id {bad[0]}, outside {self.model_name}'s vocabulary "
                                       f"(0..{self.vocab_size - 1})", "input")
                ids = list(item)
            else:
                raise RequestError(f"input[{i}] must be a string or a list of token ids", "input")
            room = self.max_tokens - 2
            if len(ids) > room:
                if not truncate:
                    raise RequestError(f"input[{i}] has {len(ids) + 2} tokens; {self.model_name} reads at most "
                                       f"{self.max_tokens}: shorten it, or send truncate=true to cut it", "input")
                ids = ids[:room]
            out.append([self.cls_id, *ids, self.sep_id])
        return out

    def embed(self, inputs: Union[str, list], truncate: bool = False, timeout: Optional[float] = None) -> Embeddings:
        """One vector per input (strings or token id lists), in order; blocks until they are made."""
        ids = self.input_ids([inputs] if isinstance(inputs, str) else inputs, truncate)
        return self.submit(ids).result(timeout)

    def submit(self, ids: list[list[int]]) -> Future:
        """`ids` (as `input_ids` makes them) queued for the model's thread; a Future of Embeddings."""
        if self._closed:
            raise EmbedderUnavailable(f"{self.model_name} is closed")
        self.wait_ready()
        work = _Work(ids, Future())
        with self._lock:
            self._busy += 1
        work.future.add_done_callback(lambda _: self._done())
        self._queue.put(work)
        return work.future

    def _done(self) -> None:
        with self._lock:
            self._busy -= 1

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._job.join(timeout)

    def __enter__(self) -> "Embedder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the model's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            model = self._load()
        except BaseException as exc:  # the reason goes to every caller (wait_ready), the thread lives on
            self.load_error = exc
            self._ready.set()
            return
        self._ready.set()
        while True:
            work = self._queue.get()
            batch = []
            while work is not None:
                batch.append(work)
                try:
                    work = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._serve(model, batch)
            if work is None:  # closed: whatever was queued after it fails
                self._fail_waiting()
                return

    def _load(self):
        import mlx.core as mx
        from mlx.utils import tree_flatten
        from mlx_embeddings.utils import load_model

        model = load_model(self.folder)
        swap_gelu(model)
        self.weights_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        mx.eval(model.parameters())
        return model

    def _serve(self, model, batch: list[_Work]) -> None:
        rows = [(w, i, ids) for w in batch for i, ids in enumerate(w.ids)]
        out = {id(w): np.zeros((len(w.ids), self.dimensions), dtype=np.float32) for w in batch}
        failed: dict[int, BaseException] = {}
        by_length: dict[int, list] = {}
        for row in rows:
            by_length.setdefault(bucket(len(row[2])), []).append(row)
        for length, group in sorted(by_length.items()):
            per_forward = max(1, self.max_batch_tokens // length)
            for start in range(0, len(group), per_forward):
                chunk = [r for r in group[start:start + per_forward] if id(r[0]) not in failed]
                if not chunk:
                    continue
                try:
                    vectors = self._forward(model, [r[2] for r in chunk], length)
                except Exception as exc:  # this forward's requests fail, the others go on
                    for r in chunk:
                        failed[id(r[0])] = exc
                    continue
                for (w, i, _), v in zip(chunk, vectors):
                    out[id(w)][i] = v
        for w in batch:
            if id(w) in failed:
                w.future.set_exception(failed[id(w)])
            else:
                w.future.set_result(Embeddings(out[id(w)], sum(len(ids) for ids in w.ids)))

    def _forward(self, model, ids: list[list[int]], length: int) -> np.ndarray:
        import mlx.core as mx

        tokens = np.zeros((len(ids), length), dtype=np.int32)
        mask = np.zeros((len(ids), length), dtype=np.float32)
        for r, row in enumerate(ids):
            tokens[r, :len(row)] = row
            mask[r, :len(row)] = 1.0
        mask_mx = mx.array(mask)
        hidden = model(mx.array(tokens), attention_mask=mask_mx).last_hidden_state.astype(mx.float32)
        pooled = pool(hidden, mask_mx, self.pooling.mode)
        if self.pooling.normalize:
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        result = np.array(pooled)
        self.forwards += 1
        return result

    def _fail_waiting(self) -> None:
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                return
            if work is not None:
                work.future.set_exception(EmbedderUnavailable(f"{self.model_name} is closed"))


def swap_gelu(model) -> int:
    """The encoder's exact GELUs (mlx.nn.GELU modules) swapped for the kernels' (kernels/ops.gelu), through
    MLX's module API as nn.quantize swaps layers; the number swapped. An approximate GELU is left as is."""
    import mlx.nn as nn

    from mlx_nb.kernels import ops

    class ExactGelu(nn.Module):
        def __call__(self, x):
            return ops.gelu(x)

    swapped = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if isinstance(child, nn.GELU) and getattr(child, "_approx", "none") == "none":
                setattr(module, name, ExactGelu())
                swapped += 1
    return swapped


def pool(hidden: Any, mask: Any, mode: str) -> Any:
    """One vector per row of `hidden` (rows, tokens, width), over the tokens `mask` keeps."""
    import mlx.core as mx

    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        last = mx.sum(mask, axis=1).astype(mx.int32) - 1
        return mx.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    if mode == "max":
        return mx.max(mx.where(mask[..., None] > 0, hidden, -mx.inf), axis=1)
    summed = mx.sum(hidden * mask[..., None], axis=1)
    return summed / mx.maximum(mx.sum(mask, axis=1, keepdims=True), 1e-9)


def _tokenizer(folder: Path):
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:
        raise EmbedderUnavailable(f"{folder.name}: no readable tokenizer.json ({type(exc).__name__})") from None
    tok.no_truncation()  # the file's own (128 for MiniLM) is not the model's limit: ours is checked
    tok.no_padding()
    return tok


def _json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise EmbedderUnavailable(f"{path.parent.name}: no readable {path.name}") from None
