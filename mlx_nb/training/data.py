"""What a fine-tune learns from: the rows a user hands over, as mlx_lm's tuner reads them.

mlx_lm's datasets take one of three shapes per file, chosen by its first row: chat
(`{"messages": [...]}`), completions (`{"prompt", "completion"}`) or text (`{"text"}`). Users hold
their examples as lists of conversations, pandas DataFrames or JSONL files; this turns each of
those into rows of one shape, drops rows that teach nothing (counted, with the reason), and splits
off a validation set when none is given, seeded so that a job asked for again splits the same way.
Nothing here imports MLX or pandas (pandas objects are read through their own methods).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Optional

SHAPES = ("chat", "completions", "text")
VAL_FRACTION = 0.1  # of the rows, when no validation set is given
MAX_VAL_ROWS = 100  # a validation pass costs a forward per row: enough to see the curve, no more


class TrainingDataError(ValueError):
    """Rows that cannot be trained on; the message says which and what to change."""


def _records(data: Any) -> list:
    """The rows of `data` as plain Python values, whatever container they came in (a dataset job: its
    finished rows as conversations, the model's answers as the assistant's turns)."""
    if callable(getattr(data, "conversations", None)):
        return data.conversations()
    if isinstance(data, (str, Path)):
        path = Path(data).expanduser()
        if not path.is_file():
            raise TrainingDataError(f"{path} is not a file: pass a JSONL file, a list of conversations or a DataFrame")
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise TrainingDataError(f"{path} line {number} is not JSON: fix or remove it") from None
        return rows
    if type(data).__module__.startswith("pandas"):
        if hasattr(data, "to_dict") and hasattr(data, "columns"):
            return data.to_dict("records")
        raise TrainingDataError("pass a pandas DataFrame (with prompt/completion, messages or text columns), "
                                "not a Series")
    if isinstance(data, dict) or not hasattr(data, "__iter__"):
        raise TrainingDataError("data must be a list of conversations or rows, a JSONL path or a pandas DataFrame")
    return list(data)


def _row(value: Any, index: int) -> tuple[str, dict]:
    """(shape, row in mlx_lm's form) of one example; TrainingDataError for one of no known shape."""
    if isinstance(value, list):  # a conversation given as its messages
        value = {"messages": value}
    if not isinstance(value, dict):
        raise TrainingDataError(f"row {index} is a {type(value).__name__}: each row must be a conversation "
                                "(a list of messages) or a dict with messages, prompt/completion or text")
    if "messages" in value:
        messages = value["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise TrainingDataError(f"row {index}'s messages must be a list of {{'role', 'content'}} dicts")
        return "chat", {"messages": [{"role": m["role"], "content": m.get("content") or ""} for m in messages]}
    if "prompt" in value and "completion" in value:
        return "completions", {"prompt": str(value["prompt"]), "completion": str(value["completion"])}
    if "text" in value:
        return "text", {"text": str(value["text"])}
    raise TrainingDataError(f"row {index} has fields {sorted(value)[:6]}: give it messages, prompt and "
                            "completion, or text")


def _teaches(shape: str, row: dict) -> Optional[str]:
    """Why `row` teaches nothing (None if it does)."""
    if shape == "chat":
        messages = row["messages"]
        if not messages or messages[-1]["role"] != "assistant":
            return "its last message is not the assistant's"
        if not str(messages[-1]["content"]).strip():
            return "the assistant's answer is empty"
    elif shape == "completions" and not row["completion"].strip():
        return "its completion is empty"
    elif shape == "text" and not row["text"].strip():
        return "its text is empty"
    return None


def rows_of(data: Any, name: str = "data") -> tuple[str, list[dict], dict[str, int]]:
    """(shape, usable rows, {reason: rows dropped}) of `data`; every row must have one shape."""
    shape, rows, dropped = None, [], {}
    for i, value in enumerate(_records(data)):
        kind, row = _row(value, i)
        if shape is None:
            shape = kind
        elif kind != shape:
            raise TrainingDataError(f"{name} row {i} is {kind} but the rows before it are {shape}: "
                                    "use one shape for all rows")
        reason = _teaches(kind, row)
        if reason:
            dropped[reason] = dropped.get(reason, 0) + 1
        else:
            rows.append(row)
    if not rows:
        why = "; ".join(f"{n} row(s): {r}" for r, n in dropped.items()) or "it is empty"
        raise TrainingDataError(f"{name} has no usable rows ({why})")
    return shape, rows, dropped


def split(rows: list[dict], val: Any, batch_size: int, seed: int) -> tuple[list[dict], list[dict], dict]:
    """(train rows, validation rows, what was dropped from `val`): `val` as given, else a seeded
    tenth of `rows` (at least one batch, at most MAX_VAL_ROWS). Both need a whole batch."""
    dropped: dict = {}
    if val is not None:
        _, val_rows, dropped = rows_of(val, "val")
        train = rows
    else:
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        take = min(MAX_VAL_ROWS, max(batch_size, round(len(rows) * VAL_FRACTION)))
        if len(rows) - take < batch_size:
            raise TrainingDataError(f"{len(rows)} usable rows are too few to train and validate on with batch_size="
                                    f"{batch_size}: give at least {2 * batch_size}, or pass val= separately")
        chosen = set(order[:take])
        val_rows = [rows[i] for i in order[:take]]
        train = [r for i, r in enumerate(rows) if i not in chosen]
    for what, part in (("training", train), ("validation", val_rows)):
        if len(part) < batch_size:
            raise TrainingDataError(f"the {what} set has {len(part)} rows, fewer than batch_size={batch_size}: "
                                    "add rows or lower batch_size")
    return train, val_rows, dropped
