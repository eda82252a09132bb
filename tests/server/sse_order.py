"""SSE bytes as the ordered list a client reads: comments included, so keep-alives can be placed."""

import json


def sse_items(raw: bytes) -> list[tuple[str, str, object]]:
    """`("comment", text, None)` or `("event", name, data)` (data parsed as JSON when it is)."""
    out = []
    for block in raw.decode().split("\n\n"):
        name, data = "", []
        for line in block.split("\n"):
            if line.startswith(":"):
                out.append(("comment", line[1:].strip(), None))
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            text = "\n".join(data)
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = text
            out.append(("event", name, parsed))
    return out
