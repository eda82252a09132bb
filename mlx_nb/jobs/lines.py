"""A batch's input lines, read as OpenAI's Batch API reads them, and its output lines as it writes them.

Input: one JSON object a line, `{"custom_id", "method": "POST", "url", "body"}`. A line that is not
JSON, lacks a field, or names another endpoint than the batch's does not stop the batch: it becomes
that line's entry in the error file (`invalid` lines). Two lines with one `custom_id` are refused
when the batch is created, with their line numbers, since the results could not be told apart.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from mlx_nb.jobs.store import new_id

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


class BatchInputError(ValueError):
    """The input file as a whole cannot make a batch (the message says what to change)."""


def endpoint_of(url: Any) -> Optional[str]:
    """A line's or batch's `url` as one of ENDPOINTS (with or without the `/v1` prefix), else None."""
    if not isinstance(url, str):
        return None
    path = "/" + url.strip().lstrip("/")
    path = path if path.startswith("/v1/") else "/v1" + path
    return path if path in ENDPOINTS else None


def parse_input(data: bytes, endpoint: Optional[str]) -> list[dict]:
    """The input file's lines as job rows: `{"row", "custom_id", "url", "body"}`, or for a line that
    cannot run `{"row", "custom_id", "error": {"code", "message"}}` (its line number in the message).
    `endpoint` None lets each line name its own (as `jupyter mlx batch` does)."""
    rows: list[dict] = []
    seen: dict[str, list[int]] = {}
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        row = {"row": len(rows), "line": number, "custom_id": None}
        rows.append(row)
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            row["error"] = _error("invalid_json", f"line {number} is not JSON ({exc}): each line must be one "
                                  "request object")
            continue
        if not isinstance(line, dict):
            row["error"] = _error("invalid_request", f"line {number} is not a JSON object")
            continue
        cid = line.get("custom_id")
        if isinstance(cid, str) and cid:
            row["custom_id"] = cid
            seen.setdefault(cid, []).append(number)
        else:
            row["error"] = _error("missing_custom_id", f"line {number} has no custom_id (a non-empty string)")
            continue
        url = endpoint_of(line.get("url"))
        if url is None:
            row["error"] = _error("invalid_url", f"line {number}: url {line.get('url')!r} is not an endpoint a batch "
                                  f"can run (one of {', '.join(ENDPOINTS)})")
            continue
        if endpoint is not None and url != endpoint:
            row["error"] = _error("mismatched_url", f"line {number}: url {url} differs from the batch's endpoint "
                                  f"{endpoint}: one batch runs one endpoint")
            continue
        method = line.get("method", "POST")
        if not isinstance(method, str) or method.upper() != "POST":
            row["error"] = _error("invalid_method", f"line {number}: method must be POST")
            continue
        if not isinstance(line.get("body"), dict):
            row["error"] = _error("invalid_body", f"line {number}: body must be the request object")
            continue
        row.update(url=url, body=line["body"])
    repeated = {cid: numbers for cid, numbers in seen.items() if len(numbers) > 1}
    if repeated:
        shown = "; ".join(f"{cid!r} on lines {', '.join(map(str, n))}" for cid, n in list(repeated.items())[:5])
        raise BatchInputError(f"custom_id must be unique within a batch: {shown}"
                              + (f" (and {len(repeated) - 5} more)" if len(repeated) > 5 else ""))
    if not rows:
        raise BatchInputError("the input file holds no request lines")
    return rows


def _error(code: str, message: str) -> dict:
    return {"code": code, "message": message}


def output_line(row: dict, status: int, body: Optional[dict], error: Optional[dict]) -> dict:
    """One line of the output (or error) file, as OpenAI writes it, plus our `row` index."""
    response = None if body is None else {"status_code": status, "request_id": new_id("req"), "body": body}
    return {"row": row["row"], "id": new_id("batch_req"), "custom_id": row.get("custom_id"),
            "response": response, "error": error}


def failed(line: dict) -> bool:
    """Whether a result line belongs in the error file."""
    response = line.get("response") or {}
    return line.get("error") is not None or response.get("status_code", 200) >= 400


def public(line: dict) -> dict:
    """A result line as the Batch API's output file shows it (our bookkeeping fields left out)."""
    return {k: line[k] for k in ("id", "custom_id", "response", "error")}
