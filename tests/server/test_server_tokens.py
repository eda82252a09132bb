"""The tokenizer's routes, as llama-server has them: `tokenize` (with and without special tokens,
with pieces), `detokenize` (the round trip, and a 400 for an id outside the vocabulary) and
`apply-template` (the prompt text a chat request would read, template switches included)."""

import pytest

from live_server import serving

MODEL = "tiny-qwen3-think"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("tokens"), MODEL) as server:
        yield server


def _post(live, path, body):
    return live.http.post(f"{live.url}/{path}", json=body)


@pytest.mark.parametrize("text", ["hello world", "naïve café 🙂", "<think>a</think>", "", "line\n\ttab"])
def test_tokenize_and_detokenize_round_trip(live, text):
    ids = _post(live, "tokenize", {"content": text}).json()["tokens"]
    assert all(isinstance(i, int) for i in ids)
    assert _post(live, "detokenize", {"tokens": ids}).json()["content"] == text
    pieces = _post(live, "tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids


def test_special_tokens_are_one_id_each(live):
    ids = _post(live, "tokenize", {"content": "<think>"}).json()["tokens"]
    assert len(ids) == 1


def test_detokenize_refuses_ids_outside_the_vocabulary(live):
    r = _post(live, "detokenize", {"tokens": [1, 10**6]})
    assert r.status_code == 400 and "not a token id of this model" in r.json()["error"]["message"]
    r = _post(live, "detokenize", {"tokens": "abc"})
    assert r.status_code == 400


def test_apply_template_is_what_a_chat_request_reads(live):
    messages = [{"role": "user", "content": "hi"}]
    prompt = _post(live, "apply-template", {"messages": messages}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    off = _post(live, "apply-template", {"messages": messages,
                                         "chat_template_kwargs": {"enable_thinking": False}}).json()["prompt"]
    assert off.endswith("<think>\n\n</think>\n\n")
    count = live.http.post(f"{live.base}/mlx/v1/messages/count_tokens",
                           json={"model": MODEL, "messages": messages}).json()["input_tokens"]
    assert count == len(_post(live, "tokenize", {"content": prompt}).json()["tokens"])
    bad = _post(live, "apply-template", {"messages": [{"role": "wizard", "content": "x"}]})
    assert bad.status_code == 400
