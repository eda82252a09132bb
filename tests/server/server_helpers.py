"""Small helpers shared by the server tests (request bodies, SSE parsing)."""

import json

from traitlets.config import Config

MODEL = "tiny-llama"
HELLO = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def server_config(server=None, **mlx) -> Config:
    """The extension on, unauthenticated access off, the tiny model; `mlx` overrides MLXExtension."""
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"jupyter_ext": True, "jupyter_server_terminals": False},
                "allow_unauthenticated_access": False,
                **(server or {}),
            },
            "MLXExtension": {"model": MODEL, **mlx},
        }
    )


def body(obj) -> bytes:
    return json.dumps(obj).encode()


def sse_events(raw: bytes) -> list[tuple[str, str]]:
    """`(event name or "", data)` per SSE event; comments and `id:` lines are skipped."""
    out = []
    for block in raw.decode().split("\n\n"):
        name, data = "", []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out
