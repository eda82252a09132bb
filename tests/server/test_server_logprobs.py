"""Logprobs in OpenAI's format on every route that takes them (chat completions, completions,
Responses), whole and streamed, through the unmodified openai SDK, against an independent
reference: mlx_lm's `generate_step` on the same prompt tokens, its log-probabilities ranked here.
Each route's chosen tokens are the reference's greedy tokens, their logprobs its values, and the
`top_logprobs` alternatives its most likely tokens, best first."""

from __future__ import annotations

import math

import openai
import pytest

from live_server import serving
from mlx_nb.compat.checks import chat_tokens
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.models import load_model

MODEL, MAX_TOKENS, TOP = "tiny-llama", 6, 3
ASK = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The colours of the sea are"
TOLERANCE = 2e-3  # float32 log-softmax over the same logits, summed in another order


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("logprobs"), MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def oa(live):
    return openai.OpenAI(base_url=live.url, api_key=live.key, max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """(token text, logprob, [(alternative, logprob)] * TOP) per greedy step, for the chat and the prompt."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    loaded = load_model(MODEL)
    tok = loaded.tokenizer

    def steps(prompt: list[int]) -> list[tuple]:
        out = []
        for token, logprobs in generate_step(mx.array(prompt), loaded.model, max_tokens=MAX_TOKENS):
            if int(token) in tok.eos_token_ids:
                break
            values = logprobs.astype(mx.float32).tolist()
            best = sorted(range(len(values)), key=lambda i: -values[i])[:TOP]
            out.append((tok.decode([int(token)]), values[int(token)], [(tok.decode([i]), values[i]) for i in best]))
        assert len(out) >= 2, "the reference ends at once: the comparison would prove little"
        return out

    return {"chat": steps(chat_tokens(loaded, ASK)), "prompt": steps(encode_prompt(tok, PROMPT, chat=False))}


def check(got: list[tuple], expected: list[tuple]) -> None:
    """got: (token, logprob, [(alternative, logprob)]) per token, as a route named them."""
    assert [g[0] for g in got] == [e[0] for e in expected]
    for (_, lp, top), (_, want, want_top) in zip(got, expected):
        assert math.isclose(lp, want, abs_tol=TOLERANCE)
        assert [t for t, _ in top] == [t for t, _ in want_top]
        assert all(math.isclose(a, b, abs_tol=TOLERANCE) for (_, a), (_, b) in zip(top, want_top))


def chat_entries(content) -> list[tuple]:
    return [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]


def test_chat_completions_whole_and_streamed(oa, reference):
    body = dict(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=TOP)
    check(chat_entries(oa.chat.completions.create(**body).choices[0].logprobs.content), reference["chat"])
    streamed = []
    for chunk in oa.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                streamed += chat_entries(choice.logprobs.content)
    check(streamed, reference["chat"])


def test_completions_whole_and_streamed(oa, reference):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=TOP)

    def entries(lp) -> list[tuple]:
        return [(t, v, sorted(alts.items(), key=lambda kv: -kv[1]))
                for t, v, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)]

    # the legacy format's alternatives are a {text: logprob} map: two byte tokens that both decode to
    # "\ufffd" are one key there, as in OpenAI's (the map keeps the later of the two)
    expected = [(t, v, sorted(dict(top).items(), key=lambda kv: -kv[1])) for t, v, top in reference["prompt"]]
    whole = oa.completions.create(**body).choices[0].logprobs
    check(entries(whole), expected)
    assert whole.text_offset[0] == 0
    streamed = []
    for chunk in oa.completions.create(**body, stream=True):
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.tokens:
                streamed += entries(choice.logprobs)
    check(streamed, expected)


def test_responses_whole_and_streamed(oa, reference):
    body = dict(model=MODEL, input=ASK, max_output_tokens=MAX_TOKENS, temperature=0, top_logprobs=TOP,
                include=["message.output_text.logprobs"])
    (text,) = oa.responses.create(**body).output[0].content
    check(chat_entries(text.logprobs), reference["chat"])
    streamed, done = [], None
    with oa.responses.stream(**body) as events:
        for event in events:
            if event.type == "response.output_text.delta":
                streamed += chat_entries(event.logprobs)
            elif event.type == "response.output_text.done":
                done = chat_entries(event.logprobs)
    check(streamed, reference["chat"])
    assert done == streamed
    plain = oa.responses.create(**{k: v for k, v in body.items() if k not in ("include", "top_logprobs")})
    assert plain.output[0].content[0].logprobs == []  # asked for by `include` only, as OpenAI's
