"""OpenAI / Anthropic wire formats <-> engine requests and outputs.

Pure functions and pydantic models: no HTTP framework, no MLX. A route does
`parse_*_request(body, ...)` -> `*_engine_kwargs(req)` -> `engine.submit_request(SubmitRequest.of(**kwargs))`, then either
`*_response(req, handle.result(), ...)` or a `*Stream(...).feed(delta)` per Delta, framed with
`sse_event`. Every rejection is an `APIError` carrying its status and both error shapes.
`mlx_nb.api.routes` packages those steps per route (chat, completions, messages, responses), so
one HTTP handler runs them all; `ServerDefaults` is what a server fills in for omitted fields.
"""

from mlx_nb.api.anthropic_messages import (
    CountTokensRequest,
    MessagesRequest,
    anthropic_message,
    count_tokens_kwargs,
    messages_engine_kwargs,
    messages_response,
    parse_count_tokens_request,
    parse_messages_request,
    stop_reason,
)
from mlx_nb.api.anthropic_stream import MessagesStream, error_event
from mlx_nb.api.errors import (
    APIError,
    from_request_error,
    from_validation_error,
    invalid_request,
    model_loading,
    model_not_found,
    not_found,
    request_too_large,
    server_error,
)
from mlx_nb.api.models_list import model_card, models_list
from mlx_nb.api.openai_chat import (
    ChatRequest,
    chat_completion,
    chat_engine_kwargs,
    chat_engine_requests,
    chat_response,
    parse_chat_request,
    parse_tool_calls,
)
from mlx_nb.api.openai_chat_stream import ChatStream
from mlx_nb.api.openai_common import error_chunk
from mlx_nb.api.openai_completions import (
    CompletionRequest,
    CompletionStream,
    completion_engine_kwargs,
    completion_engine_requests,
    completion_response,
    parse_completion_request,
)
from mlx_nb.api.openai_responses import (
    ResponsesRequest,
    parse_responses_request,
    responses_engine_kwargs,
    responses_response,
)
from mlx_nb.api.openai_responses_stream import ResponsesStream
from mlx_nb.api.request_common import ServerDefaults
from mlx_nb.api.sse import sse_comment, sse_done, sse_event
from mlx_nb.api.tool_calls import DEFAULT_MARKERS, ToolCallSplitter, split_tool_calls

__all__ = [
    "APIError",
    "ChatRequest",
    "ChatStream",
    "CompletionRequest",
    "CompletionStream",
    "CountTokensRequest",
    "DEFAULT_MARKERS",
    "MessagesRequest",
    "MessagesStream",
    "ResponsesRequest",
    "ResponsesStream",
    "ServerDefaults",
    "ToolCallSplitter",
    "anthropic_message",
    "chat_completion",
    "chat_engine_kwargs",
    "chat_engine_requests",
    "chat_response",
    "completion_engine_kwargs",
    "completion_engine_requests",
    "completion_response",
    "count_tokens_kwargs",
    "error_chunk",
    "error_event",
    "from_request_error",
    "from_validation_error",
    "invalid_request",
    "messages_engine_kwargs",
    "messages_response",
    "model_card",
    "model_loading",
    "model_not_found",
    "models_list",
    "not_found",
    "parse_chat_request",
    "parse_completion_request",
    "parse_count_tokens_request",
    "parse_messages_request",
    "parse_responses_request",
    "parse_tool_calls",
    "request_too_large",
    "responses_engine_kwargs",
    "responses_response",
    "server_error",
    "split_tool_calls",
    "sse_comment",
    "sse_done",
    "sse_event",
    "stop_reason",
]
