"""One chat API (sync, async, streaming) over the embedded engine or any OpenAI-compatible URL."""

from mlx_nb.client.backends import close_engines, shared_engine
from mlx_nb.client.client import Client, openai_client
from mlx_nb.client.content import build_messages, image_url
from mlx_nb.client.streams import (
    AsyncChatStream,
    ChatReply,
    ChatStream,
    ClientError,
    MlxConnectionError,
)
from mlx_nb.client.waiting import ModelLoadingError

__all__ = [
    "AsyncChatStream",
    "ChatReply",
    "ChatStream",
    "Client",
    "ClientError",
    "MlxConnectionError",
    "ModelLoadingError",
    "build_messages",
    "close_engines",
    "image_url",
    "openai_client",
    "shared_engine",
]
