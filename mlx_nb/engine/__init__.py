"""The batched engine: requests, messages, prompts, caches, scheduler, events."""

from mlx_nb.engine.engine import Engine, EngineClosedError
from mlx_nb.engine.handle import RequestHandle
from mlx_nb.engine.types import (
    Delta,
    Request,
    RequestError,
    Result,
    SamplingParams,
    TooLargeError,
    Usage,
)

__all__ = [
    "Delta",
    "Engine",
    "EngineClosedError",
    "Request",
    "RequestError",
    "RequestHandle",
    "Result",
    "SamplingParams",
    "TooLargeError",
    "Usage",
]
