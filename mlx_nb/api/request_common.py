"""What every wire request shares: a JSON body, a model name, a token budget, sampling knobs.

Checks live here once so chat, completions and messages reject the same mistakes with the same
words. Sampling ranges follow OpenAI's documented limits (`logit_bias` token ids are checked
against the vocabulary by the engine); `top_k`, `min_p` and `repetition_penalty` are the common
extensions (vLLM, llama.cpp, mlx_lm.server) clients send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Optional, TypeVar, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from mlx_nb.api.errors import (
    from_validation_error,
    invalid_request,
    model_not_found,
)

M = TypeVar("M", bound=BaseModel)
MAX_CHOICES = 16  # `n`: each choice is one row of the shared batch


class WireModel(BaseModel):
    """Base for request models: unknown fields are ignored, as the real APIs' SDKs add new ones.
    JSON's true/false is not a number: pydantic would read it as 1/0, the real APIs refuse it."""

    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and _wants_number(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


def _wants_number(annotation: Any) -> bool:
    kinds, todo = set(), [annotation]
    while todo:
        t = todo.pop()
        args = get_args(t)
        if args:
            todo.extend(args)
        else:
            kinds.add(t)
    return bool(kinds & {int, float}) and bool not in kinds


def load_body(body: Union[dict, bytes, str]) -> dict:
    """The request as a dict; malformed JSON, a non-object body or text that is not Unicode (a
    lone surrogate such as "\\ud800", which JSON lets through) is a 400 that says so."""
    if isinstance(body, (bytes, bytearray, str)):
        try:
            body = json.loads(body)
        except UnicodeDecodeError:
            raise invalid_request("request body is not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise invalid_request(
                f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
        except RecursionError:
            raise invalid_request("request body is not valid JSON: it nests deeper than Python can read") from None
        except ValueError:  # an integer with more digits than Python converts
            raise invalid_request("request body is not valid JSON: a number is too long to read") from None
    if not isinstance(body, dict):
        raise invalid_request(f"request body must be a JSON object, not {type(body).__name__}")
    _check_unicode(body)
    return body


def _check_unicode(body: dict) -> None:
    """Every string and key must be Unicode text: a lone UTF-16 surrogate is refused here, once,
    instead of failing in the tokenizer or the response writer. Iterative: bodies nest deeply."""
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        path, node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            where = f"{path}.{key}" if path else str(key)
            for text, what in ((key, "key"), (value, "value")):
                if isinstance(text, str) and not _is_unicode(text):
                    shown = where.encode("utf-8", "backslashreplace").decode("utf-8")  # the key may be the culprit
                    raise invalid_request(
                        f"{shown}: the {what} holds a lone UTF-16 surrogate, which is not Unicode text: "
                        "send surrogate pairs whole (or the character itself)",
                        shown,
                    )
            if isinstance(value, (dict, list)):
                todo.append((where, value))


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate(model: type[M], data: dict) -> M:
    """`model.model_validate(data)` with pydantic's errors turned into a one-line 400."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, data) from None


@dataclass(frozen=True)
class ServerDefaults:
    """What a server fills in for fields a request leaves out, and how it names its model.

    `max_tokens` None: a reply may use the rest of the context (what the APIs do when a client
    sends no budget); `max_tokens_cap` bounds every reply, asked-for budgets included (larger ones
    are clamped, and the response says so). A sampling setting a request leaves out comes from
    `sampling`, the model's own recommendation (its generation_config.json); else `temperature` is
    the server's (servers pass the APIs' documented 1.0 unless configured; None keeps the engine's
    greedy default). `aliases` map names clients are configured with to the served model;
    `any_model` accepts every name when one model is served.
    """

    max_tokens: Optional[int] = None
    max_tokens_cap: Optional[int] = None
    temperature: Optional[float] = None
    sampling: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)
    any_model: bool = False

    def budget(self, requested: Optional[int]) -> Optional[int]:
        """The engine's max_tokens: the request's (or the default), at most the cap; None = rest of context."""
        value = self.max_tokens if requested is None else requested
        if self.max_tokens_cap is not None:
            value = self.max_tokens_cap if value is None else min(value, self.max_tokens_cap)
        return value

    def resolve_model(self, name: Optional[str], model_names: Optional[Iterable[str]]) -> Optional[str]:
        """The served model a request's `model` means (None: any); an unknown name is a 404."""
        if name is None or model_names is None:
            return name
        names = list(model_names)
        if not names or name in names:
            return name
        target = self.aliases.get(name)
        if target in names:
            return target
        if self.any_model and len(names) == 1:
            return names[0]
        raise model_not_found(name, names + sorted(a for a, t in self.aliases.items() if t in names))


def parse_request(
    model: type[M], body: Union[dict, bytes, str], model_names: Optional[Iterable[str]], defaults: "ServerDefaults"
) -> M:
    """Validate a body as `model` and check its model name; every problem is an `APIError`."""
    req = validate(model, load_body(body))
    check_model(getattr(req, "model", None), model_names, defaults)
    return req


def check_model(name: Optional[str], model_names: Optional[Iterable[str]], defaults: "ServerDefaults") -> None:
    """An omitted model means "whatever is loaded"; a named one must be servable (else 404)."""
    defaults.resolve_model(name, model_names)


def generation_kwargs(defaults: "ServerDefaults", budget: Optional[int], given: dict) -> dict:
    """What to add to a request's engine kwargs `given`: `max_tokens` (always present: None asks the
    engine for the rest of the context), then for each sampling setting the request left out the
    model's recommended value, else for `temperature` the server's default. A request's own values
    always win."""
    out: dict[str, Any] = {"max_tokens": defaults.budget(budget)}
    for name, value in defaults.sampling.items():
        if given.get(name) is None:
            out[name] = value
    if given.get("temperature") is None and "temperature" not in out and defaults.temperature is not None:
        out["temperature"] = defaults.temperature
    return out


def stop_list(stop: Union[str, list[str], None]) -> list[str]:
    """`stop` may be one string or a list; empty strings would stop at once, so they are dropped."""
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop) if s]


class SamplingFields(WireModel):
    """Sampling fields shared by the two OpenAI routes (Anthropic names some differently)."""

    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)  # -1 is vLLM's "disabled"; 0 is ours
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[int, float]] = None  # JSON keys are token ids as strings: pydantic converts
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    # Output constraints besides response_format, as llama.cpp's server (json_schema, grammar in
    # GBNF) and vLLM's (guided_json, guided_regex, guided_grammar in Lark) take them; docs/structured-outputs.md.
    json_schema: Union[dict, str, None] = None
    grammar: Optional[str] = None
    guided_json: Union[dict, str, None] = None
    guided_regex: Optional[str] = None
    guided_grammar: Optional[str] = None


CONSTRAINT_FIELDS = ("json_schema", "grammar", "guided_json", "guided_regex", "guided_grammar")


class ReasoningFields(WireModel):
    """A thinking model's switches, as the peers take them: the chat template's own arguments
    (`{"enable_thinking": false}`), OpenAI's `reasoning_effort` (gpt-oss's templates read it), and a
    budget of reasoning tokens after which the reasoning is closed (llama-server's reasoning budget;
    `thinking_budget` is accepted too)."""

    chat_template_kwargs: Optional[dict] = None
    reasoning_effort: Optional[Literal["minimal", "low", "medium", "high"]] = None
    reasoning_budget: Optional[int] = Field(None, ge=0)
    thinking_budget: Optional[int] = Field(None, ge=0)


def reasoning_kwargs(req: Any, effort: Optional[str] = None, budget: Optional[int] = None,
                     enabled: Optional[bool] = None) -> dict[str, Any]:
    """Engine kwargs for a request's reasoning switches (`effort`, `budget`, `enabled`: what a route
    names otherwise, as Anthropic's `thinking` and the Responses API's `reasoning` do)."""
    template = dict(getattr(req, "chat_template_kwargs", None) or {})
    effort = effort or getattr(req, "reasoning_effort", None)
    if effort is not None:
        template.setdefault("reasoning_effort", effort)
    if enabled is not None:
        template.setdefault("enable_thinking", enabled)
    if budget is None:
        budget = next((v for v in (getattr(req, "reasoning_budget", None), getattr(req, "thinking_budget", None))
                       if v is not None), None)
    out: dict[str, Any] = {}
    if template:
        out["chat_template_kwargs"] = template
    if budget is not None:
        out["reasoning_budget"] = budget
    return out


def constraint_kwargs(req: Any, response_format: Any = None) -> dict[str, Any]:
    """`{"constraint": ...}` for the engine when the request constrains its output (response_format
    json_object / json_schema, or one extension field), else {}. Two constraints at once are a 400."""
    from mlx_nb.api.constraint_fields import constraint_of

    fmt = response_format.model_dump(exclude_none=True) if hasattr(response_format, "model_dump") else response_format
    found = constraint_of(fmt, **{f: getattr(req, f, None) for f in CONSTRAINT_FIELDS})
    return {"constraint": found} if found is not None else {}


def sampling_kwargs(req: SamplingFields) -> dict[str, Any]:
    """Engine kwargs for the sampling fields the client set; unset ones keep the engine's defaults."""
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "logit_bias", "seed"):
        if (value := getattr(req, name)) is not None:
            out[name] = value
    if req.top_k is not None:
        out["top_k"] = max(req.top_k, 0)
    out["stop"] = stop_list(req.stop)
    return out


def engine_logprobs(requested: bool, top: Optional[int]) -> int:
    """The engine's `logprobs` is "how many alternatives; 0 = none", so a request for the chosen
    token's logprob alone asks for one alternative, and the response trims it back to `top`."""
    return max(top or 0, 1) if requested else 0
