"""Images in chat messages -> RGB PIL images, decoded on the CALLER's thread (no MLX here).

Accepted in a message's content list, OpenAI style or directly:
- `{"type": "image_url", "image_url": {"url": ...}}` (also `"image_url": "..."`, and `input_image`);
- `{"type": "image", "image": <PIL image | HxW[xC] ndarray | url or path string>}`;
- `{"type": "image", "source": {"type": "base64", "media_type": ..., "data": ...}}` (Anthropic).
A url is a `data:` URL (png, jpeg, webp, gif: first frame), a local path or `file://` URL under one
of the allowed roots (a relative path is relative to the first root; no hidden file or folder,
i.e. no path component starting with "."), or an http(s) URL (refused unless remote images are
allowed; then fetched as remote_images.py says). Anything wrong raises a one-line RequestError
naming the field, e.g. "messages[0].content[1]: ...".
mlx_vlm's own `load_image` is not used because a server needs what it lacks: allowed roots, byte
and pixel limits, remote URLs refused by default, and errors that name the offending part.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Callable, Iterator

from mlx_nb.engine.inputs import remote_images
from mlx_nb.engine.types import RequestError, TooLargeError

IMAGE_PART_TYPES = {"image", "image_url", "input_image"}


@dataclass
class ImageOptions:
    roots: list[Path] = field(default_factory=lambda: [Path.cwd()])  # local files only under these
    allow_remote: bool = False
    allow_private: bool = False  # remote images from loopback / private / link-local ... addresses too
    max_bytes: int = 20 * 1024 * 1024  # per image, encoded
    max_pixels: int = 40_000_000  # per image, width x height
    timeout_s: float = 10.0  # for remote images, when allowed: the whole fetch, redirects included
    resolve: Callable[[str, int], list[str]] = remote_images.resolve  # host, port -> addresses
    connect: Callable[[str, int, float], Any] = remote_images.connect  # address, port, timeout -> socket

    def __post_init__(self):
        roots = [self.roots] if isinstance(self.roots, (str, Path)) else self.roots
        self.roots = [Path(r).expanduser().resolve() for r in roots]


def decode_message_images(messages: Any, opts: ImageOptions) -> Any:
    """A copy of `messages` in which every image part is `{"type": "image", "image": <RGB PIL>}`.

    Anything that is not a list of message dicts is returned as is, for normalize_messages to refuse.
    """
    return _replace_parts(messages, {id(part): {"type": "image", "image": decode_part(part, where, opts)}
                                     for where, part in _image_parts(messages)})


async def prefetch_remote_images(messages: Any, opts: ImageOptions) -> Any:
    """A copy of `messages` whose http(s) image parts hold the fetched bytes, for a server to await
    before `submit` (which then decodes them): fetching never holds a thread the server shares."""
    if not opts.allow_remote:
        return messages
    found = [(where, part, url) for where, part in _image_parts(messages) if (url := remote_images.remote_url(part))]
    if not found:
        return messages
    data = await asyncio.gather(*(remote_images.afetch(url, where, opts) for where, _, url in found))
    return _replace_parts(messages, {id(part): {"type": "image", "image": blob}
                                     for (_, part, _), blob in zip(found, data)})


def _image_parts(messages: Any) -> Iterator[tuple[str, dict]]:
    """(where, part) for every image part of a list of message dicts; anything else yields nothing
    (normalize_messages refuses it later)."""
    if not isinstance(messages, list):
        return
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                yield f"messages[{i}].content[{j}]", part


def _replace_parts(messages: Any, new: dict) -> Any:
    """`messages` with the parts whose id() is in `new` replaced (the rest shared, not copied)."""
    if not new:
        return messages
    return [{**m, "content": [new.get(id(p), p) for p in m["content"]]}
            if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in messages]


def images_in(messages: list[dict]) -> list:
    """The decoded images of a normalized conversation, in the order the template renders them."""
    return [
        p["image"]
        for m in messages
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") == "image"
    ]


def decode_part(part: dict, where: str, opts: ImageOptions):
    value = part.get("image")
    if value is None:
        value = part.get("image_url")
    if value is None and isinstance(part.get("source"), dict):
        value = _anthropic_source(part["source"], where)
    if isinstance(value, dict):
        value = value.get("url")
    if value is None:
        raise RequestError(f"{where}: image part has no image: give image_url.url (a data: URL or a file path)", where)
    return load_image(value, where, opts)


def load_image(value: Any, where: str, opts: ImageOptions):
    """An RGB PIL image from a PIL image, an ndarray, or a url/path string."""
    from PIL import Image

    if isinstance(value, Image.Image):
        _check_pixels(value.size, where, opts)
        return _rgb(value, where)
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return _from_array(value, where, opts)
    if isinstance(value, (bytes, bytearray)):
        return _from_bytes(bytes(value), where, opts)
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"{where}: an image must be a data: URL, a file path, a PIL image or an array", where)
    value = value.strip()
    lower = value[:16].lower()
    if lower.startswith("data:"):
        return _from_bytes(_data_url_bytes(value, where, opts), where, opts)
    if lower.startswith(("http://", "https://")):
        return _from_bytes(_fetch(value, where, opts), where, opts)
    if lower.startswith("file://"):
        value = urllib.request.url2pathname(urllib.parse.urlparse(value).path)
    elif "://" in lower:
        raise RequestError(f"{where}: unsupported image URL scheme {value.split('://')[0]!r}: use data:, file:// or a path", where)
    return _from_bytes(_read_file(value, where, opts), where, opts)


# -- sources ------------------------------------------------------------------------------------
def _anthropic_source(source: dict, where: str) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    if source.get("type") == "url" and source.get("url"):
        return source["url"]
    raise RequestError(f"{where}: unsupported image source {source.get('type')!r}", where)


def _data_url_bytes(url: str, where: str, opts: ImageOptions) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise RequestError(f"{where}: malformed data: URL (no comma before the data)", where)
    if not header.lower().endswith(";base64"):
        raise RequestError(f"{where}: data: URL must be base64-encoded (data:image/png;base64,...)", where)
    if len(payload) * 3 // 4 > opts.max_bytes:
        raise TooLargeError(f"{where}: image is larger than {opts.max_bytes} bytes", where)
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"{where}: data: URL is not valid base64 ({exc})", where) from exc


def _read_file(value: str, where: str, opts: ImageOptions) -> bytes:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = opts.roots[0] / path  # the server's root dir, not the process's cwd
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        raise RequestError(f"{where}: image file not found: {value}", where) from None
    root = next((r for r in opts.roots if real == r or real.is_relative_to(r)), None)
    if root is None:
        roots = ", ".join(str(r) for r in opts.roots)
        raise RequestError(f"{where}: image path {value} is outside the allowed image roots ({roots})", where)
    if _hidden(PurePath(value)) or _hidden(real.relative_to(root)):
        raise RequestError(f"{where}: image path {value} is or is inside a hidden file or folder: not served", where)
    if not real.is_file():
        raise RequestError(f"{where}: image path {value} is not a file", where)
    if real.stat().st_size > opts.max_bytes:
        raise TooLargeError(f"{where}: image file is larger than {opts.max_bytes} bytes", where)
    with open(real, "rb") as f:
        return f.read(opts.max_bytes + 1)


def _hidden(path: PurePath) -> bool:
    return any(part.startswith(".") and part not in (".", "..") for part in path.parts)


def _fetch(url: str, where: str, opts: ImageOptions) -> bytes:
    if not opts.allow_remote:
        raise RequestError(
            f"{where}: remote image URLs are not fetched (allow_remote_images=False): send a data: URL or a local file",
            where,
        )
    return remote_images.fetch(url, where, opts)


# -- decoding -----------------------------------------------------------------------------------
def _from_bytes(data: bytes, where: str, opts: ImageOptions):
    from PIL import Image

    if len(data) > opts.max_bytes:
        raise TooLargeError(f"{where}: image is larger than {opts.max_bytes} bytes", where)
    try:
        img = Image.open(io.BytesIO(data))
        _check_pixels(img.size, where, opts)  # from the header, before decoding any pixel
        img.seek(0)  # animated formats: the first frame
        img.load()
    except RequestError:
        raise
    except (Image.DecompressionBombError, OSError, SyntaxError, ValueError, EOFError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RequestError(f"{where}: not a readable image ({detail})", where) from exc
    return _rgb(img, where)


def _from_array(arr, where: str, opts: ImageOptions):
    import numpy as np
    from PIL import Image

    a = np.asarray(arr)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[-1] in (3, 4))):
        raise RequestError(f"{where}: an image array must be HxW, HxWx3 or HxWx4, not shape {tuple(a.shape)}", where)
    _check_pixels((a.shape[1], a.shape[0]), where, opts)
    if a.dtype != np.uint8:
        if np.issubdtype(a.dtype, np.floating) and a.size and 0.0 <= float(a.min()) and float(a.max()) <= 1.0:
            a = a * 255.0
        a = np.clip(a, 0, 255).astype(np.uint8)
    return _rgb(Image.fromarray(a), where)


def _check_pixels(size: tuple, where: str, opts: ImageOptions) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise RequestError(f"{where}: image is empty ({w}x{h})", where)
    if w * h > opts.max_pixels:
        raise TooLargeError(f"{where}: image is {w}x{h}, more than {opts.max_pixels} pixels", where)


def _rgb(img, where: str):
    from PIL import Image

    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB") if img.mode != "RGB" else img.copy()

