"""Requests to a vision-language model, on the CALLER's thread: images decoded, prompt rendered.

Each request to a vision model is prefilled alone through mlx_vlm (vision_prefill.py) and then
decoded in the shared batch (the adapter in mlx_nb/models/vision.py). Text-only requests to a
vision model take the same path, so every row of the batch has the same cache layout. Rendering is
pure templating (no MLX), so a template error is refused at submit with a one-line message.
"""

from __future__ import annotations

from typing import Any, Optional

from mlx_nb.engine.inputs.control_text import inert
from mlx_nb.engine.inputs.generic_tools import tool_format, with_tools
from mlx_nb.engine.inputs.images import IMAGE_PART_TYPES
from mlx_nb.engine.types import RequestError


# -- prompts (caller thread: no MLX) ------------------------------------------------------------
def template_messages(messages: list[dict]) -> list[dict]:
    """The conversation as the template sees it: image parts become `{"type": "image"}`
    (their pixels never go through jinja), text parts stay, strings stay strings."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [
                {"type": "image"} if p.get("type") in IMAGE_PART_TYPES else {"type": "text", "text": p.get("text", "")}
                for p in content
            ]
        out.append({**m, "content": content})
    return out


def render_vision_prompt(
    loaded: Any,
    messages: list[dict],
    tools: Optional[list] = None,
    template_kwargs: Optional[dict] = None,
) -> str:
    """The prompt text of a normalized conversation: system prompt and every turn, each image as
    the template's placeholder (the processor expands it to the image's token count). Control-token
    text inside the conversation stays text (`control_text`)."""
    template = getattr(loaded.processor, "chat_template", None) or loaded.tokenizer.chat_template
    if template is None:
        raise RequestError(f"{loaded.name} has no chat template: send a completion prompt instead", "messages")
    try:
        tok = loaded.tokenizer
        return with_tools(_renderer(loaded, template, template_kwargs), str(template), inert(messages, tok), inert(tools, tok))
    except RequestError:
        raise
    except Exception as exc:  # jinja TemplateError, or a template's raise_exception
        raise RequestError(f"the chat template rejected the conversation: {exc}", "messages") from exc


def vision_tool_format(loaded: Any) -> str:
    """How tools reach a vision model: "template" or "generic" (see `generic_tools`)."""
    template = getattr(loaded.processor, "chat_template", None) or loaded.tokenizer.chat_template
    return tool_format(_renderer(loaded, template, None), None if template is None else str(template))


def _renderer(loaded: Any, template: Any, template_kwargs: Optional[dict]):
    def render(messages: list[dict], tools: Optional[list]) -> str:
        return loaded.tokenizer.apply_chat_template(
            template_messages(messages),
            chat_template=template,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )

    return render


def prepare_vision_request(loaded: Any, request: Any, image_options: Any) -> tuple[list[int], list, str]:
    """Caller thread: decode images, normalize and render a request to a vision model.

    Returns (prompt_tokens, images, prompt_text). Until the prefill expands them, each image
    counts as one token (its placeholder): the vision prefill replaces the tokens with the real ones.
    """
    from mlx_nb.engine.inputs.images import decode_message_images, images_in
    from mlx_nb.engine.inputs.messages import normalize_messages
    from mlx_nb.engine.inputs.prompts import encode_prompt

    if request.messages is None:
        if not isinstance(request.prompt, str):
            raise RequestError("prompt must be a string", "prompt")
        return encode_prompt(loaded.tokenizer, request.prompt, chat=False), [], request.prompt
    messages = normalize_messages(decode_message_images(request.messages, image_options))
    request.messages = messages
    text = render_vision_prompt(loaded, messages, request.tools, request.chat_template_kwargs)
    return encode_prompt(loaded.tokenizer, text, chat=True), images_in(messages), text
