"""Turn a request into prompt token ids with the model's own chat template."""

from __future__ import annotations

from typing import Any, Optional

from mlx_nb.engine.inputs.control_text import inert
from mlx_nb.engine.inputs.generic_tools import tool_format, with_tools
from mlx_nb.engine.inputs.messages import has_images
from mlx_nb.engine.types import RequestError


def flatten_text(messages: list[dict]) -> list[dict]:
    """List content of text-only messages becomes a string (text models' templates expect one)."""
    out = []
    for m in messages:
        if isinstance(m["content"], list):
            m = {**m, "content": "".join(p.get("text", "") for p in m["content"])}
        out.append(m)
    return out


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    tools: Optional[list] = None,
    template_kwargs: Optional[dict] = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for a normalized conversation; template errors become RequestErrors. Tools
    reach the model whatever the template: natively, or inlined (`generic_tools`). Control-token text
    inside the conversation stays text (`control_text`)."""
    if has_images(messages):
        raise RequestError("this model is text-only and cannot read images: send text, or load a vision model", "messages")
    try:
        return with_tools(_renderer(tokenizer, template_kwargs, add_generation_prompt), _template(tokenizer),
                          inert(messages, tokenizer), inert(tools, tokenizer))
    except RequestError:
        raise
    except Exception as exc:  # jinja TemplateError, or a template's raise_exception
        raise RequestError(f"the chat template rejected the conversation: {exc}", "messages") from exc


def chat_tool_format(tokenizer: Any) -> str:
    """How tools reach this tokenizer's model: "template" (its chat template renders them) or "generic"."""
    return tool_format(_renderer(tokenizer, None, True), _template(tokenizer))


def _template(tokenizer: Any) -> Optional[str]:
    if not getattr(tokenizer, "has_chat_template", True) or tokenizer.chat_template is None:
        return None
    return str(tokenizer.chat_template)


def _renderer(tokenizer: Any, template_kwargs: Optional[dict], add_generation_prompt: bool):
    def render(messages: list[dict], tools: Optional[list]) -> str:
        if _template(tokenizer) is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in flatten_text(messages)) + "assistant:"
        return tokenizer.apply_chat_template(
            flatten_text(messages),
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **(template_kwargs or {}),
        )

    return render


def encode_prompt(tokenizer: Any, text: str, *, chat: bool) -> list[int]:
    """Token ids; a chat prompt already holds its special tokens, a completion gets the BOS."""
    ids = tokenizer.encode(text, add_special_tokens=not chat)
    if not ids:
        raise RequestError("the prompt is empty: send some text", "prompt")
    return list(ids)
