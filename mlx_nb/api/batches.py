"""OpenAI's Files and Batches APIs over the job machinery (mlx_nb/jobs): each route's whole work,
free of the web framework. A handler hands over what it read (the upload's bytes, a JSON body, a
path id) and writes what comes back; every refusal is an APIError that names what to change.

- `/v1/files`: upload (`purpose="batch"`), list, retrieve, content, delete. An upload over the size
  limit is a 413 naming the limit; one past the disk budget a 507 saying what to free.
- `/v1/batches`: create (from an uploaded file: malformed lines and unknown urls become that line's
  entry in the error file, duplicate `custom_id`s are refused here with their line numbers), retrieve,
  list, cancel. A batch object carries the Batch API's fields plus `progress` (rows/s, tokens/s, ETA).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from mlx_nb.api.errors import APIError, invalid_request, not_found

PURPOSES = ("batch", "batch_output", "fine-tune", "assistants", "user_data", "evals")


def _file_missing(file_id: str) -> APIError:
    return not_found(f"no file {file_id!r}: GET /v1/files lists them")


def _batch_missing(batch_id: str) -> APIError:
    return not_found(f"no batch {batch_id!r}: GET /v1/batches lists them")


def upload_file(store, data: Optional[bytes], filename: str, purpose: Optional[str], limit: int) -> dict:
    from mlx_nb.jobs.store import StoreFull

    if data is None:
        raise invalid_request("send the file as multipart form data in the field 'file'", "file")
    if purpose not in PURPOSES:
        raise invalid_request(f"purpose must be one of {', '.join(PURPOSES)} (batch files: 'batch'), "
                              f"not {purpose!r}", "purpose")
    if len(data) > limit:
        raise file_too_large(len(data), limit)
    try:
        return store.create_file(data, filename or "upload.jsonl", purpose)
    except StoreFull as exc:
        raise APIError(507, str(exc), "server_error", "file", "storage_full") from None


def file_too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the file is {size} bytes; this server takes files up to {limit} bytes "
                    "(MLXExtension.max_file_bytes): split it into several batches", "invalid_request_error", "file",
                    "file_too_large")


def file_object(store, file_id: str) -> dict:
    try:
        return store.file(file_id)
    except KeyError:
        raise _file_missing(file_id) from None


def file_content(store, file_id: str) -> bytes:
    try:
        return store.file_path(file_id).read_bytes()
    except KeyError:
        raise _file_missing(file_id) from None


def list_files(store, purpose: Optional[str] = None) -> dict:
    return {"object": "list", "data": store.files(purpose), "has_more": False}


def delete_file(store, file_id: str) -> dict:
    if not store.delete_file(file_id):
        raise _file_missing(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def create_batch(manager, body: bytes) -> dict:
    from mlx_nb.jobs.lines import BatchInputError
    from mlx_nb.jobs.store import StoreFull

    req = _json_object(body)
    input_file_id, endpoint = req.get("input_file_id"), req.get("endpoint")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise invalid_request("input_file_id is required: upload the JSONL with purpose 'batch' first",
                              "input_file_id")
    if not isinstance(endpoint, str):
        raise invalid_request("endpoint is required: /v1/chat/completions or /v1/completions", "endpoint")
    metadata = req.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise invalid_request("metadata must be an object of string values", "metadata")
    try:
        return manager.create_batch(input_file_id, endpoint, req.get("completion_window", "24h"), metadata)
    except KeyError:
        raise _file_missing(input_file_id) from None
    except BatchInputError as exc:
        raise invalid_request(str(exc), "input_file_id") from None
    except StoreFull as exc:
        raise APIError(507, str(exc), "server_error", None, "storage_full") from None


def retrieve_batch(manager, batch_id: str) -> dict:
    try:
        return manager.describe(batch_id)
    except KeyError:
        raise _batch_missing(batch_id) from None


def list_batches(manager, limit: Any = None, after: Optional[str] = None) -> dict:
    try:
        n = 20 if limit is None else int(limit)
    except (TypeError, ValueError):
        raise invalid_request("limit must be a whole number from 1 to 100", "limit") from None
    if not 1 <= n <= 100:
        raise invalid_request("limit must be a whole number from 1 to 100", "limit")
    data = manager.list(n + 1, after)
    return {"object": "list", "data": data[:n], "first_id": data[0]["id"] if data else None,
            "last_id": data[:n][-1]["id"] if data else None, "has_more": len(data) > n}


def cancel_batch(manager, batch_id: str) -> dict:
    try:
        return manager.cancel(batch_id)
    except KeyError:
        raise _batch_missing(batch_id) from None


def _json_object(body: bytes) -> dict:
    try:
        value = json.loads(body or b"{}")
    except (ValueError, RecursionError) as exc:
        raise invalid_request(f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise invalid_request("the body must be a JSON object")
    return value
