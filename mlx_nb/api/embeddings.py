"""OpenAI's embeddings route, as a wire format: the request parsed and checked, the reply shaped.

`input` is a string, a list of strings, a list of token ids or a list of token-id lists (OpenAI's
four forms); `encoding_format` "float" or "base64" (little-endian float32, as OpenAI's SDK decodes
it); `dimensions` is refused with a 400 for a model not trained to be cut (all-MiniLM-L6-v2 is
not): a truncated vector of such a model is a different, worse vector, not a smaller one.
`truncate` (not OpenAI's; llama.cpp's and Cohere's servers have the same switch) cuts inputs
longer than the model reads instead of refusing them. No MLX here: the Embedder makes the vectors.
"""

from __future__ import annotations

import base64
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from mlx_nb.api.errors import APIError, from_validation_error

MAX_INPUTS = 2048  # OpenAI's limit per request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    truncate: bool = False


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    try:
        req = EmbeddingRequest.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    if isinstance(req.input, list) and not req.input:
        raise APIError(400, "input must not be empty: send a string or a list of them", param="input")
    if isinstance(req.input, list) and len(req.input) > MAX_INPUTS:
        raise APIError(400, f"input has {len(req.input)} items; at most {MAX_INPUTS} per request: send them in "
                       "several requests (or as a batch job)", param="input")
    return req


def inputs_of(req: EmbeddingRequest) -> list:
    """The request's inputs as a list of strings or token-id lists, one per vector."""
    if isinstance(req.input, str):
        return [req.input]
    if req.input and isinstance(req.input[0], int):  # one list of token ids is one input
        return [list(req.input)]
    return list(req.input)


def check_dimensions(req: EmbeddingRequest, model: str, width: int) -> None:
    """`dimensions` is for models trained to be cut (Matryoshka); none served so far is."""
    if req.dimensions is None or req.dimensions == width:
        return
    raise APIError(400, f"{model} gives {width}-dimensional vectors and was not trained to be cut shorter: "
                   "leave dimensions out (or send it as the full width)", param="dimensions")


def embedding_response(model: str, vectors, tokens: int, encoding_format: str = "float") -> dict:
    """OpenAI's reply: one `embedding` object per input, in order, and the tokens read."""
    import numpy as np

    data = []
    for i, v in enumerate(vectors):
        v = np.asarray(v, dtype="<f4")
        embedding = base64.b64encode(v.tobytes()).decode() if encoding_format == "base64" else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": int(tokens), "total_tokens": int(tokens)}}


def answer(req: EmbeddingRequest, embedder) -> dict:
    """The reply body for `req` from `embedder` (an Embedder: blocks while it embeds; call it from a
    thread): what the route and a batch's embeddings lines both send back."""
    check_dimensions(req, embedder.model_name, embedder.dimensions)
    result = embedder.embed(inputs_of(req), req.truncate)
    return embedding_response(embedder.model_name, result.vectors, result.tokens, req.encoding_format)
