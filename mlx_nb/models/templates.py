"""Chat templates for the tiny fixtures.

`STRICT_CHATML` is as strict as Qwen 3.5's own template: a system message anywhere but first, or
user/assistant turns that don't alternate, raise. Tests of message normalization run against it,
so they exercise the very failure real users hit, not a lenient template.
"""

_TOOLS = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif -%}"
    "# Tools\n<tools>\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "For each function call, return a json object within <tool_call></tool_call> tags.<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
)

_CONTENT = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type in ('image', 'image_url') -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)

STRICT_CHATML = (
    _CONTENT
    + _TOOLS
    + "{%- set ns = namespace(last='') %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- if not loop.first %}{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{%- elif m.role in ('user', 'assistant') %}"
    "{%- if ns.last == m.role %}{{ raise_exception('Conversation roles must alternate user/assistant.') }}{% endif %}"
    "{%- set ns.last = m.role %}"
    "<|im_start|>{{ m.role }}\n{{ render(m.content) if m.content else '' }}"
    "{%- if m.tool_calls %}{%- for tc in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}"
    "{%- set ns.last = 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}{{ raise_exception('Unexpected message role ' + m.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LENIENT_CHATML = (
    _CONTENT
    + "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ render(m.content) if m.content else '' }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# A thinking template in the style of Qwen3-Thinking and the DeepSeek-R1 distills: the prompt opens
# `<think>` (the reply starts inside the reasoning); `enable_thinking=False` writes an empty block
# instead, as Qwen3's does; an assistant turn after the last user message keeps its reasoning (a
# tool loop inside the turn), earlier ones drop it.
THINKING_CHATML = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role in ('system', 'user') %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if m.reasoning_content and loop.index0 > ns.last_user %}<think>\n{{ m.reasoning_content }}\n</think>\n\n"
    "{% endif %}{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
    "{%- endif %}"
)

# gpt-oss's harmony format, reduced to what the engine reads: `reasoning_effort` in the system
# message, an earlier turn's `thinking` kept on the last assistant turn only, and a reply that
# opens a channel (`analysis` for reasoning, `final` for the answer).
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
HARMONY = (
    "<|start|>system<|message|>You are a helpful assistant.\n"
    "Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{%- for m in messages %}"
    "{%- if m.role in ('system', 'developer') %}<|start|>developer<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' %}"
    "{%- if m.thinking and loop.last %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif %}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)
