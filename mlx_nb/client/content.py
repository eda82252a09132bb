"""Chat messages from text, a system prompt and images (paths, bytes, PIL) in OpenAI's shape.

Images become `image_url` parts with data URLs, so the same message list works for the embedded
engine and for any OpenAI-compatible server.
"""

from __future__ import annotations

import base64
import io
import mimetypes
import os
import sys
from pathlib import Path
from typing import Any, Optional


def image_url(image: Any) -> str:
    """A data URL (or the http URL) for a path, bytes, PIL image, array or URL: OpenAI's image_url form."""
    if isinstance(image, str) and image.startswith(("data:", "http://", "https://")):
        return image
    if isinstance(image, (str, Path)):
        path = Path(image).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"image not found: {path}")
        return _data_url(path.read_bytes(), mimetypes.guess_type(path.name)[0] or "image/png")
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        return _data_url(data, "image/jpeg" if data[:3] == b"\xff\xd8\xff" else "image/png")
    if hasattr(image, "__array_interface__") and not hasattr(image, "save"):  # a numpy array (HWC)
        from PIL import Image

        image = Image.fromarray(image)
    if hasattr(image, "save") and hasattr(image, "size"):  # a PIL image
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return _data_url(buf.getvalue(), "image/png")
    raise TypeError(f"cannot send a {type(image).__name__} as an image: give a path, bytes, PIL image, numpy array or URL")


def _data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def build_messages(messages_or_text: Any, system: Optional[str] = None, images: Any = None) -> list[dict]:
    """Chat messages from a string or a message list, with a system prompt and images added."""
    if isinstance(messages_or_text, str):
        messages = [{"role": "user", "content": messages_or_text}]
    else:
        messages = [dict(m) for m in messages_or_text]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    if images is not None and not isinstance(images, (list, tuple)):
        images = [images]
    if images:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise ValueError("images need a user message to attach to")
        msg = messages[users[-1]]
        content = msg.get("content")
        text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        parts = [{"type": "image_url", "image_url": {"url": image_url(im)}} for im in images]
        messages[users[-1]] = {**msg, "content": parts + text}
    return messages


def request_source() -> str:
    """Who is asking, for the batch timeline: `notebook NAME` in a Jupyter kernel (the server names
    a kernel's notebook in JPY_SESSION_NAME), `ipython` in another IPython shell, else `python`.
    ASCII, so it fits an HTTP header."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    if shell is None:
        return "python"
    if type(shell).__name__ != "ZMQInteractiveShell":
        return "ipython"
    name = os.path.basename(os.environ.get("JPY_SESSION_NAME", ""))
    return f"notebook {name}".strip().encode("ascii", "replace").decode()[:80]


def response_format_of(value: Any) -> Optional[dict]:
    """OpenAI's `response_format` for a pydantic model class, a JSON schema dict, or a
    response_format dict as is (None: free text)."""
    if value is None or (isinstance(value, dict) and "type" in value and value["type"] in
                         ("text", "json_object", "json_schema")):
        return value
    schema_of = getattr(value, "model_json_schema", None)
    if isinstance(value, type) and callable(schema_of):  # a pydantic model class
        return {"type": "json_schema", "json_schema": {"name": value.__name__, "schema": schema_of(), "strict": True}}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": value, "strict": True}}
    raise TypeError(f"response_format: give a pydantic model class, a JSON schema dict or OpenAI's "
                    f"response_format, not {type(value).__name__}")
