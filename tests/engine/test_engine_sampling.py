"""Per-request sampling in one shared batch: each request gets exactly its own settings."""

import pytest

from mlx_nb.engine.types import RequestError

PROMPT = "hello"  # tiny-llama's greedy reply to this loops over a few tokens: penalties must show


def test_logit_bias_forces_its_token_and_leaves_the_neighbour_alone(llama_engine):
    alone = llama_engine.generate(prompt="neighbour", max_tokens=10)
    biased = llama_engine.submit(prompt=PROMPT, max_tokens=10, logit_bias={123: 100})
    neighbour = llama_engine.submit(prompt="neighbour", max_tokens=10)
    assert biased.result(timeout=60).token_ids == [123] * 10
    assert neighbour.result(timeout=60).token_ids == alone.token_ids


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                                     {"repetition_penalty": 2.0}])
def test_penalties_break_a_repetitive_greedy_reply(llama_engine, penalty):
    plain = llama_engine.generate(prompt=PROMPT, max_tokens=40).token_ids
    penalised = llama_engine.generate(prompt=PROMPT, max_tokens=40, **penalty).token_ids
    assert len(set(penalised)) > len(set(plain)), (plain, penalised)


def test_a_seeded_request_samples_the_same_alone_and_in_company(llama_engine):
    seeded = dict(prompt=PROMPT, max_tokens=16, temperature=1.0, seed=7)
    alone = llama_engine.generate(**seeded).token_ids
    company = [llama_engine.submit(prompt=f"other {i}", max_tokens=16, temperature=1.0) for i in range(3)]
    again = llama_engine.submit(**seeded)
    for h in company:
        h.result(timeout=60)
    assert again.result(timeout=60).token_ids == alone
    assert llama_engine.generate(**{**seeded, "seed": 8}).token_ids != alone


def test_a_greedy_request_is_unchanged_next_to_a_sampling_one(llama_engine):
    alone = llama_engine.generate(prompt="greedy", max_tokens=12).token_ids
    hot = llama_engine.submit(prompt=PROMPT, max_tokens=12, temperature=1.5, top_p=0.9, min_p=0.05)
    greedy = llama_engine.submit(prompt="greedy", max_tokens=12)
    assert greedy.result(timeout=60).token_ids == alone
    sampled = hot.result(timeout=60)  # a random model may sample its end token: either ending is its own
    assert sampled.error is None and sampled.finish_reason in ("length", "stop") and sampled.token_ids


def test_top_k_of_one_is_greedy_at_any_temperature(llama_engine):
    greedy = llama_engine.generate(prompt=PROMPT, max_tokens=12).token_ids
    assert llama_engine.generate(prompt=PROMPT, max_tokens=12, temperature=1.5, top_k=1).token_ids == greedy


@pytest.mark.parametrize(
    "bias",
    [{10**6: 1.0}, {-1: 1.0}, {5: 101.0}, {"5": 1.0}],
    ids=["beyond-vocab", "negative-id", "too-strong", "string-id"],
)
def test_bad_logit_bias_is_refused_at_submit(llama_engine, bias):
    with pytest.raises(RequestError) as err:
        llama_engine.submit(prompt=PROMPT, logit_bias=bias)
    assert err.value.field == "logit_bias" and "token ids" in str(err.value)
