"""A map over a table: rows in (strings, dicts, a pandas Series or DataFrame), chat requests out, and
their answers back as values aligned with the rows (a list, or DataFrame columns).

Each row becomes one `/v1/chat/completions` body (the prompt template filled with the row's
fields), so a map is a batch job like any other and runs, persists and resumes the same way.
With a `schema` (a JSON schema dict, a pydantic model or a dataclass) every answer is held to it
token by token and parsed; an answer the budget cut short before the schema closed is that row's
error, as is a prompt too long for the model. pandas is never imported unless the inputs are pandas.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

DEFAULT_FIELD = "text"  # what a string row is called in the template ("Classify: {text}")


class MapResults(list):
    """The answers in row order (None where a row failed), with `errors` ({row: message}), `usage`
    (token totals) and the `job_id` that holds them."""

    errors: dict
    usage: dict
    job_id: Optional[str] = None


def _pandas(value: Any):
    module = type(value).__module__
    if module.startswith("pandas"):
        import pandas

        return pandas
    return None


def row_fields(inputs: Any) -> list[dict]:
    """Each input row as the fields a template may name."""
    pd = _pandas(inputs)
    if pd is not None and isinstance(inputs, pd.DataFrame):
        return [{str(k): v for k, v in row.items()} for row in inputs.to_dict("records")]
    if pd is not None and isinstance(inputs, pd.Series):
        name = str(inputs.name) if inputs.name is not None else None
        return [{DEFAULT_FIELD: v, **({name: v} if name else {})} for v in inputs.tolist()]
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise TypeError("inputs must be a list of strings or dicts, or a pandas Series or DataFrame")
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            out.append({DEFAULT_FIELD: item})
        elif isinstance(item, dict):
            out.append({str(k): v for k, v in item.items()})
        else:
            raise TypeError(f"row {i} is a {type(item).__name__}: each row must be a string or a dict")
    return out


def schema_of(schema: Any) -> Optional[dict]:
    """A JSON schema from a dict, a pydantic model class or a dataclass (None for none)."""
    if schema is None:
        return None
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if dataclasses.is_dataclass(schema):
        from pydantic import TypeAdapter

        return TypeAdapter(schema).json_schema()
    raise TypeError("schema must be a JSON schema dict, a pydantic model class or a dataclass")


def render(template: Optional[str], fields: dict, index: int) -> str:
    if template is None:
        if DEFAULT_FIELD in fields and len(fields) <= 2:
            return str(fields[DEFAULT_FIELD])
        raise ValueError("give prompt= (a template such as 'Classify: {text}') to say how a row becomes a prompt")
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise ValueError(f"row {index} has no field {exc.args[0]!r} for the prompt template (its fields: "
                         f"{', '.join(fields) or 'none'})") from None
    except (IndexError, ValueError) as exc:
        raise ValueError(f"the prompt template cannot be filled: {exc}: name fields as {{text}}") from None


def map_rows(inputs: Any, prompt: Optional[str], *, model: Optional[str], system: Optional[str] = None,
             schema: Any = None, max_tokens: int = 256, temperature: float = 0.0, top_p: Optional[float] = None,
             seed: Optional[int] = None, stop: Any = None) -> list[dict]:
    """The job rows of a map: one chat completion body per input row (all rendered before any runs,
    so a template mistake is found at once)."""
    json_schema = schema_of(schema)
    rows = []
    for i, fields in enumerate(row_fields(inputs)):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": render(prompt, fields, i)}]
        body: dict = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if model:
            body["model"] = model
        for key, value in (("top_p", top_p), ("seed", seed), ("stop", stop)):
            if value is not None:
                body[key] = value
        if json_schema is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "row", "schema": json_schema, "strict": True}}
        rows.append({"row": i, "custom_id": str(i), "url": "/v1/chat/completions", "body": body})
    return rows


def answer_of(line: dict, schema: Any) -> tuple[Any, Optional[str]]:
    """(answer, None) for a finished row, (None, why) for a failed one."""
    if line.get("error") is not None:
        return None, str(line["error"].get("message") or line["error"])
    body = (line.get("response") or {}).get("body") or {}
    choice = (body.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    if schema is None:
        return text, None
    if choice.get("finish_reason") == "length":
        return None, ("the answer did not complete its schema within max_tokens "
                      f"({(body.get('usage') or {}).get('completion_tokens')} tokens): raise max_tokens")
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"the answer is not JSON ({exc})"
    if isinstance(schema, type) and hasattr(schema, "model_validate"):
        try:
            return schema.model_validate(value), None
        except Exception as exc:
            return None, f"the answer does not validate against {schema.__name__}: {exc}"
    return value, None


def shape(inputs: Any, lines: list[dict], schema: Any, out: str = "answer"):
    """The map's result: MapResults aligned with the rows, or for a DataFrame a copy with the answer's
    columns (the schema's fields, else `out`), `error`, `prompt_tokens` and `completion_tokens`."""
    by_row = {line["row"]: line for line in lines}
    total = len(inputs)
    answers, errors, usages = [], {}, []
    for i in range(total):
        line = by_row.get(i)
        if line is None:
            answers.append(None)
            errors[i] = "no result (the job did not finish this row)"
            usages.append({})
            continue
        answer, error = answer_of(line, schema)
        answers.append(answer)
        if error is not None:
            errors[i] = error
        usages.append(((line.get("response") or {}).get("body") or {}).get("usage") or {})
    pd = _pandas(inputs)
    if pd is not None and isinstance(inputs, pd.DataFrame):
        frame = inputs.copy()
        if schema is not None:
            names = list((schema_of(schema) or {}).get("properties") or {})
            values = [_as_dict(a) for a in answers]
            for name in names:
                frame[name] = [v.get(name) if v is not None else None for v in values]
        else:
            frame[out] = answers
        frame["error"] = [errors.get(i) for i in range(total)]
        frame["prompt_tokens"] = [u.get("prompt_tokens") for u in usages]
        frame["completion_tokens"] = [u.get("completion_tokens") for u in usages]
        return frame
    result = MapResults(answers)
    result.errors = errors
    result.usage = {k: sum(int(u.get(k) or 0) for u in usages) for k in ("prompt_tokens", "completion_tokens")}
    return result


def _as_dict(answer: Any) -> Optional[dict]:
    if answer is None:
        return None
    if hasattr(answer, "model_dump"):
        return answer.model_dump()
    return answer if isinstance(answer, dict) else {"value": answer}
