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
