"""The sequential lane through the route: models that cannot be batched (Gemma 2's attention cannot
take a batch's mask, Llama 4's chunked KV caches cannot merge, Llama 3.2 Vision carries
cross-attention states from step to step) are served by a real `jupyter mlx` process one request at
a time: concurrent streamed chats wait their turn, each streams the tokens mlx_lm's generate_step /
mlx_vlm's generate give it alone, a client that hangs up aborts its request, and the queue goes on.

The references run in this process, before the server answers anything (the server is another
process); the tiny text models are built from each architecture's generated config."""

import base64
import io
import json
import threading

import httpx
import pytest
from live_server import serving

from mlx_nb.compat.checks import chat_tokens
from mlx_nb.compat.configs import write_tiny
from mlx_nb.compat.reference import reply_tokens
from mlx_nb.compat.vision_check import Case, picture, reference
from mlx_nb.models import load_model

MAX_TOKENS = 8


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    """pytest-jupyter's cleanup is for in-process servers; this module runs its own processes."""
    yield


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def text_chats() -> list[list[dict]]:
    return [[{"role": "user", "content": text}] for text in
            ("Why is the sky blue?", "hi", "Name three rivers of Europe and one of Asia, please.")]


def vision_chats() -> list[tuple[list[dict], list[dict], list]]:
    """(route messages, reference messages, images): an image chat, a text-only one, two images."""
    a, b, c = picture(56, 42, 1), picture(28, 70, 2), picture(84, 28, 3)

    def both(parts):
        route = [{"type": "image_url", "image_url": {"url": data_url(p)}} if not isinstance(p, str)
                 else {"type": "text", "text": p} for p in parts]
        ref = [{"type": "image", "image": p} if not isinstance(p, str) else {"type": "text", "text": p} for p in parts]
        return [{"role": "user", "content": route}], [{"role": "user", "content": ref}], \
            [p for p in parts if not isinstance(p, str)]

    return [both([a, "what is this picture?"]), both(["describe shapes and colours briefly"]),
            both(["compare", b, c])]


def expected(model: str) -> tuple[list[list[dict]], list[list[str]], list[int]]:
    """The route's messages, the tokens each must answer (from the independent reference; each
    decoded alone, as the route's logprobs name them), and the model's end-of-sequence tokens."""
    loaded = load_model(model)
    if loaded.kind == "vision":
        chats = vision_chats()
        tokens = [reference(loaded, Case("chat", ref, images), MAX_TOKENS)[0] for _, ref, images in chats]
        messages = [route for route, _, _ in chats]
    else:
        messages = text_chats()
        tokens = [reply_tokens(loaded, chat_tokens(loaded, m), MAX_TOKENS) for m in messages]
    return messages, [[loaded.tokenizer.decode([i]) for i in t] for t in tokens], sorted(loaded.tokenizer.eos_token_ids)


@pytest.fixture(scope="module", params=["gemma2", "llama4", "tiny-mllama"])
def lane(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model = request.param if request.param.startswith("tiny-") else str(write_tiny(request.param, root / "model"))
    messages, answers, eos = expected(model)
    assert max(len(a) for a in answers) >= 2, "the references end at once: equality would prove little"
    (root / "server").mkdir()
    with serving(root / "server", model) as server:
        yield server, messages, answers, eos


def stream_chat(server, messages, out: dict, key: int, **extra) -> None:
    body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "logprobs": True, **extra}
    chunks = []
    with httpx.Client(timeout=120, trust_env=False) as client, client.stream(
            "POST", f"{server.url}/chat/completions", json=body,
            headers={"Authorization": f"Bearer {server.key}"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    out[key] = chunks


def tokens_of(chunks: list[dict]) -> list[str]:
    """The streamed tokens, as the chunks' logprobs name them."""
    return [t["token"] for c in chunks if c.get("choices") and c["choices"][0].get("logprobs")
            for t in c["choices"][0]["logprobs"]["content"] or []]


def test_concurrent_chats_wait_their_turn_and_each_equals_the_model_alone(lane):
    server, messages, answers, _ = lane
    status = server.get("status")
    assert status["policy"]["mode"] == "sequential" and status["prefill_batch"] == 1
    since = server.last_seq()
    out: dict = {}
    threads = [threading.Thread(target=stream_chat, args=(server, m, out, i)) for i, m in enumerate(messages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for i, answer in enumerate(answers):
        chunks = out[i]
        assert tokens_of(chunks) == answer, i
        reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        assert reasons[-1] == ("length" if len(answer) == MAX_TOKENS else "stop") and not any(reasons[:-1])
        assert len([r for r in reasons if r is None]) >= 2  # streamed in pieces, not in one chunk
    ids = [c["id"].removeprefix("chatcmpl-") for i in out for c in out[i][:1]]
    for rid in ids:  # a client has its last chunk a moment before the engine records the request's end
        server.wait_event(since, lambda e, rid=rid: e["kind"] == "filter" and rid in e["requests"])
    events = server.events(since)
    inserted = [e for e in events if e["kind"] == "insert" and set(e["requests"]) & set(ids)]
    assert len(inserted) == len(ids)
    # one request at a time: every decode step holds one row, and a request joins only once the
    # one before it has left
    assert all(e["detail"]["batch_size"] == 1 for e in events if e["kind"] in ("step", "extend"))
    order = [e["kind"] for e in events if e["kind"] in ("extend", "filter")]
    assert order == ["extend", "filter"] * len(ids)


def test_a_client_that_hangs_up_aborts_its_request_and_the_queue_goes_on(lane):
    server, messages, answers, eos = lane
    since = server.last_seq()
    # it never ends by itself: its end-of-sequence tokens are pushed down
    body = {"model": "m", "messages": messages[0], "max_tokens": 3000, "temperature": 0, "stream": True,
            "logit_bias": {str(t): -100 for t in eos}}
    auth = {"Authorization": f"Bearer {server.key}"}
    out: dict = {}
    waiting = threading.Thread(target=stream_chat, args=(server, messages[1], out, 0))
    with httpx.Client(timeout=60, trust_env=False) as client, client.stream(
            "POST", f"{server.url}/chat/completions", json=body, headers=auth) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                request_id = json.loads(line[6:])["id"].removeprefix("chatcmpl-")
                waiting.start()  # queued behind the long one
                break
    waiting.join(180)
    ended = server.wait_event(since, lambda e: e["kind"] == "filter" and request_id in e["requests"])
    assert tokens_of(out[0]) == answers[1]
    assert ended["detail"]["reason"] == "abort"
    assert request_id not in [r["id"] for r in server.get("status")["requests"]]
