"""`Client.embed`: vectors as a NumPy array, from this process's embedder or a server's route.

Embedded, one Embedder per process (loaded on first use, like the shared engines); against a
server, OpenAI's embeddings route through the openai SDK, asked for base64 (a quarter of the JSON's
size) and decoded here. Either way the rows come back in the order given, float32.
"""

from __future__ import annotations

import base64
import threading
from typing import Any, Optional

import numpy as np

_EMBEDDERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def shared_embedder(model: Optional[str] = None):
    """The process-wide Embedder for `model` (default: all-MiniLM-L6-v2), loaded on first use."""
    from mlx_nb.engine import DEFAULT_EMBEDDER, Embedder

    name = model or DEFAULT_EMBEDDER
    with _LOCK:
        embedder = _EMBEDDERS.get(name)
        if embedder is None or embedder.closed or embedder.load_error is not None:
            embedder = _EMBEDDERS[name] = Embedder(model)
    return embedder.wait_ready()


def close_embedders() -> None:
    with _LOCK:
        embedders = list(_EMBEDDERS.values())
        _EMBEDDERS.clear()
    for embedder in embedders:
        embedder.close()


def as_inputs(texts: Any) -> list:
    """A string, or a list (or pandas Series) of strings or token-id lists, as a list."""
    if isinstance(texts, str):
        return [texts]
    if hasattr(texts, "tolist") and not isinstance(texts, list):  # a pandas Series, a NumPy array of str
        texts = texts.tolist()
    return list(texts)


def embed_remote(openai_client, inputs: list, model: Optional[str], truncate: bool) -> np.ndarray:
    """Through a server's embeddings route (OpenAI's SDK), decoded from base64."""
    from mlx_nb.engine import DEFAULT_EMBEDDER

    reply = openai_client.embeddings.create(model=model or DEFAULT_EMBEDDER, input=inputs, encoding_format="base64",
                                            extra_body={"truncate": True} if truncate else None)
    rows = sorted(reply.data, key=lambda d: d.index)
    return np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") if isinstance(d.embedding, str)
                     else np.asarray(d.embedding, dtype=np.float32) for d in rows])
