"""Prompt-lookup speculation in the shared batch (engine/speculation/prompt_lookup.py): greedy rows give exactly the
tokens mlx_lm's generate_step gives one request at a time, several per step when the guess is right.

Tiny random models fall into loops soon: their answers repeat their own tokens, which is what prompt
lookup guesses, so the proposals are accepted often, rejected sometimes, and partly accepted in
between; rows of a batch drop different numbers of positions in the same step.
"""

import numpy as np
import pytest

from mlx_nb import Engine
from mlx_nb.compat.configs import write_tiny
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.engine.speculation.prompt_lookup import PromptLookup, cut_back, plan, propose
from mlx_nb.models import load_model
from chi_square import samples_differ
from reference import reply_tokens
from step_clock import steady_step_costs  # noqa: F401  (a fixture)

MAX_TOKENS = 48


def _texts(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(str(x) for x in rng.integers(0, 30, size=rng.integers(2, 40))) for _ in range(n)]


def _reference(path, texts, budgets) -> list[list[int]]:
    loaded = load_model(str(path))
    return [reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), m) for t, m in zip(texts, budgets)]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "granite", "qwen3_moe"])
@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_rows_give_mlx_lms_tokens_with_speculation_alone_and_batched(arch, seed, tmp_path, steady_step_costs):
    path = write_tiny(arch, tmp_path / arch, seed=seed)
    texts = _texts(seed, 9)
    budgets = [MAX_TOKENS - 7 * (i % 4) for i in range(len(texts))]  # runs end inside accepted proposals too
    want = _reference(path, texts, budgets)
    with Engine(str(path), wait=True, prefix_cache=False) as engine:
        for rows in (1, 3):
            got = []
            for i in range(0, len(texts), rows):
                handles = [engine.submit(prompt=t, max_tokens=m) for t, m in zip(texts[i:i + rows], budgets[i:i + rows])]
                got += [h.result(timeout=120).token_ids for h in handles]
            assert got == want, f"{rows} row(s) a batch"
        spec = engine.status()["speculation"]
    assert spec["accepted_tokens"] > 0 and spec["speculative_steps"] > 0


@pytest.mark.parametrize("seed", [1, 2])
def test_wrong_guesses_change_no_token(seed, tmp_path, monkeypatch, steady_step_costs):
    """Every proposal made wrong at its end (and one in three wholly wrong): rows accept part of a
    guess or none of it, drop different numbers of positions in one step, and still give mlx_lm's
    tokens."""
    from mlx_nb.engine.speculation import prompt_lookup as speculation

    path = write_tiny("qwen3", tmp_path / "qwen3", seed=seed)
    texts = _texts(seed + 10, 6)
    want = _reference(path, texts, [MAX_TOKENS] * len(texts))
    real, calls = speculation.copy_from, [0]

    def spoiled(context, start, k):
        draft = real(context, start, k)
        calls[0] += 1
        if draft and calls[0] % 3 == 0:
            return [(t + 1) % 200 for t in draft]
        return draft[:-1] + [(draft[-1] + 1) % 200] if len(draft) > 1 else draft

    monkeypatch.setattr(speculation, "copy_from", spoiled)
    with Engine(str(path), wait=True, prefix_cache=False) as engine:
        got = []
        for pair in (texts[:2], texts[2:4], texts[4:]):  # two rows a batch: small enough to speculate
            handles = [engine.submit(prompt=t, max_tokens=MAX_TOKENS) for t in pair]
            got += [h.result(timeout=120).token_ids for h in handles]
        assert got == want
        spec = engine.status()["speculation"]
    assert 0 < spec["accepted_tokens"] < spec["proposed_tokens"]


def test_sampled_constrained_and_logprob_rows_beside_speculating_ones(tmp_path):
    """Rows that cannot speculate (sampled, held to a grammar, asking for logprobs, ended by a stop
    string) share the batch with greedy ones: every greedy row still equals mlx_lm's, a seeded
    sampled row equals itself served alone, a stop string still ends its row."""
    from mlx_nb.engine.sampling.constrained import Constraint

    path = write_tiny("qwen3", tmp_path / "qwen3", seed=3)
    texts = ["hello there " * 3, "a b c d e f", "the cat sat on the mat", "one two three four"]
    want = _reference(path, texts, [MAX_TOKENS] * len(texts))
    with Engine(str(path), wait=True, prefix_cache=False) as engine:
        sampled_alone = engine.submit(prompt="7 7 7", max_tokens=20, temperature=0.9, seed=5).result(60).token_ids
        texts_out = [engine.submit(prompt=t, max_tokens=MAX_TOKENS).result(60).text for t in texts]
        row = max(range(len(texts)), key=lambda i: len(texts_out[i]))
        assert len(texts_out[row]) >= 8, texts_out
        stop_at = texts_out[row][5:8]
        handles = [engine.submit(prompt=t, max_tokens=MAX_TOKENS) for t in texts]
        others = [engine.submit(prompt="7 7 7", max_tokens=20, temperature=0.9, seed=5),
                  engine.submit(prompt="1 2", max_tokens=12, constraint=Constraint(kind="regex", value="[0-9 ]{12}")),
                  engine.submit(prompt=texts[0], max_tokens=10, logprobs=2),
                  engine.submit(prompt=texts[row], max_tokens=MAX_TOKENS, stop=[stop_at])]
        results = [h.result(timeout=120) for h in handles + others]
    assert [r.token_ids for r in results[:4]] == want
    sampled, constrained, with_logprobs, stopped = results[4:]
    assert sampled.token_ids == sampled_alone
    assert all(c in "0123456789 " for c in constrained.text) and constrained.error is None
    assert len(with_logprobs.logprobs) == len(with_logprobs.token_ids) and with_logprobs.token_ids == want[0][:10]
    assert stopped.finish_reason == "stop" and stopped.matched_stop == stop_at
    assert stopped.text == texts_out[row][:texts_out[row].index(stop_at)]


def test_speculation_off_and_caches_that_cannot_be_cut_back_decode_as_before(tmp_path):
    """`speculation=False` never proposes; a model whose caches rotate (this tiny llama's sliding
    window layers) never speculates either, and both give mlx_lm's tokens."""
    for arch, kwargs in (("qwen2", {"speculation": False}), ("llama", {})):
        path = write_tiny(arch, tmp_path / arch, seed=4)
        texts = _texts(4, 3)
        want = _reference(path, texts, [MAX_TOKENS] * 3)
        with Engine(str(path), wait=True, prefix_cache=False, **kwargs) as engine:
            handles = [engine.submit(prompt=t, max_tokens=MAX_TOKENS) for t in texts]
            assert [h.result(timeout=120).token_ids for h in handles] == want, arch
            spec = engine.status()["speculation"]
        assert spec is None if kwargs else spec["speculative_steps"] == 0


def test_propose_takes_what_followed_the_latest_earlier_ngram():
    assert propose([5, 6, 7, 8, 9, 5, 6], 3) == [7, 8, 9]
    assert propose([1, 2, 3, 1, 2, 4, 1, 2], 2) == [4, 1]  # the latest occurrence
    assert propose([1, 2, 3, 4, 2, 3, 4, 9, 3, 4], 3, max_n=3) == [9, 3, 4]  # the longest n that occurred: 3 4 -> 9
    assert propose([1, 2, 3, 4], 4) == [] and propose([7, 7], 4) == []
    assert propose([3, 3, 3, 3], 4) == [3, 3, 3, 3]  # a loop goes on copying itself
    assert propose([8, 1, 2, 1, 2, 1], 5) == [2, 1, 2, 1, 2]


def test_a_row_copying_its_prompt_resumes_after_a_renamed_name_where_the_copy_stood():
    """The lookup `plan` makes, through a row's copy pointer: past a rename (old name 5, new name
    50 51 55) the copy resumes at the old name's place, where the latest occurrence of the new
    name's tokens (the instruction) would guess wrong and no 2-gram of the text occurred before."""
    from mlx_nb.engine.speculation.prompt_lookup import RowState, continuation, copy_from

    code = [11, 12, 13, 5, 14, 15, 16, 17, 12, 13, 5, 18]
    prompt = code + [90, 5, 91, 50, 51, 55, 92]  # "... rename 5 to 50 51 55."
    state = RowState()
    row = prompt + [11, 12]
    start = continuation(row, 4, 2, state.copy_pointer(row))
    assert copy_from(row, start, 3) == [13, 5, 14]  # copying the code
    state.copying = (len(row), start)
    row += [13, 50, 51, 55, 14]  # the new name where the old one was
    assert state.copy_pointer(row) == 3  # the old name's place
    start = continuation(row, 4, 2, state.copy_pointer(row))
    assert copy_from(row, start, 3) == [15, 16, 17]
    assert continuation(row, 4, 2) is None  # without the pointer: [55, 14] never occurred
    state.copying = (len(row), start)
    row += [15, 99, 12, 13]  # a changed token, then a 2-gram the text holds twice: the place being copied
    assert copy_from(row, continuation(row, 4, 2, state.copy_pointer(row)), 2) == [5, 18]
    assert propose(row, 2) == [50, 51]  # not its latest occurrence (the answer's first line)


def test_a_row_whose_lookups_find_nothing_waits_and_its_rate_follows_its_guesses():
    from mlx_nb.engine.speculation.prompt_lookup import RowState

    spec, state = PromptLookup(), RowState()
    waits = []
    for _ in range(7):
        spec.found_nothing(state)
        waits.append(state.due - spec.steps)
    assert waits == [2, 4, 4, 4, 4, 4, 4]
    before = state.rate
    state.shadow = (3, [5, 6, 7])  # a guess not verified: scored as the tokens come
    state.settle_shadow([1, 2, 3])
    assert state.shadow is not None and state.rate == before  # no token came yet
    state.settle_shadow([1, 2, 3, 5, 6])  # right so far: scored, and let go
    assert state.shadow is None and state.rate > before
    high = state.rate
    state.shadow = (5, [4, 4])
    state.settle_shadow([1, 2, 3, 5, 6, 8])  # wrong at once
    assert state.shadow is None and state.rate < high
    spec.record(1, 4, 4)
    spec.record(1, 4, 0)
    assert (spec.proposed, spec.accepted) == (8, 4)


def test_a_row_whose_unverified_guess_comes_true_looks_up_again_at_once():
    """A guess no width paid for is scored as the tokens come; a row whose tokens confirm it looks up
    again the very next step, its rate rising, instead of waiting until the whole guess has come."""
    spec = PromptLookup()  # no step timed yet: no width pays, so every guess goes unverified

    def not_read():
        raise AssertionError("no width pays: the pending tokens must not be read")

    row = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # it has started repeating its beginning
    rates = []
    for token in (3, 4, 5, 6):
        spec.steps += 1
        assert plan(spec, [7], [row], [100], not_read) is None
        start, guess = spec.rows[7].shadow
        assert start == len(row) and guess[0] == token  # looked up this step, and right
        rates.append(spec.rows[7].rate)
        row.append(token)
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_the_width_that_pays_follows_the_measured_step_times():
    """No width before a plain step was timed; then the one that maximises the expected tokens
    per second, none when verifying costs more than it brings."""
    spec = PromptLookup()
    assert spec.best_width([0.9], [8]) == 0
    spec.plain_s[1] = 0.010
    for width, took in ((2, 0.011), (3, 0.012), (5, 0.020), (9, 0.040)):
        spec.verify_s[(1, width)] = took
    assert spec.best_width([0.9], [8]) == 2  # 1 + .81 + .73 tokens in 12 ms beats the others
    assert spec.best_width([0.05], [8]) == 0  # a row that is rarely right: plain steps
    spec.verify_s = {(1, 2): 0.030}
    assert spec.best_width([0.9], [8]) == 0  # verifying is slow here: never pays


def test_a_verifying_steps_cost_is_its_own_time_not_the_wait_before_it():
    """A verifying step first waits for the step before it (its pending tokens), as the plain step
    after that one would have: that wait is not its cost. The interval between step starts enters
    the plain table only for a plain step that followed a plain one; a verifying step's own time
    comes from `verified` alone."""
    spec = PromptLookup()
    for now in (0.0, 0.010, 0.020):
        spec.step_started(now, ("plain", 1))
    spec.step_started(0.030, ("verify", 1, 3))  # the last plain interval (10 ms) counts
    spec.verified(1, 3, 0.012)  # its own forward, after 10 ms of waiting
    spec.step_started(0.052, ("plain", 1))  # 22 ms since the verifying step started: not a cost
    spec.step_started(0.053, ("plain", 1))  # the plain step right after a verifying one waited for nothing
    spec.step_started(0.063, ("plain", 1))
    assert spec.verify_s == {(1, 3): 0.012}
    assert spec.plain_s == {1: pytest.approx(0.010)}
    spec.step_started(0.073, ("plain", 1))  # plain after plain again: learnt
    assert spec.plain_s == {1: pytest.approx(0.010)}
    spec.verified(1, 3, 0.5)  # far above its estimate (the box was busy): ignored
    assert spec.verify_s == {(1, 3): 0.012}


def test_cut_back_drops_each_rows_last_positions():
    """Three rows drop 1, 3 and 0 positions: each keeps its first tokens, right-aligned, the freed
    places become left padding, offsets count what is left (what a cache holding only the kept
    tokens holds)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    keys = mx.random.normal((3, 2, 5, 4), key=mx.random.key(0))
    values = mx.random.normal((3, 2, 5, 4), key=mx.random.key(1))
    cache = BatchKVCache([0, 0, 0])
    cache.update_and_fetch(keys, values)
    cut_back([cache], [1, 3, 0])
    k, v = cache.keys_and_values()
    assert cache.offset.tolist() == [4, 2, 5] and cache.left_padding.tolist() == [1, 3, 0]
    for row, drop in enumerate([1, 3, 0]):
        assert mx.array_equal(k[row, :, drop:], keys[row, :, :5 - drop]).item()
        assert mx.array_equal(v[row, :, drop:], values[row, :, :5 - drop]).item()
    cut_back([cache], [2, 2, 2])  # the same for every row: a plain trim
    assert cache.offset.tolist() == [2, 0, 3] and cache.keys_and_values()[0].shape[2] == 3


@pytest.mark.parametrize("bits", [8, 4])
def test_rows_with_quantized_keys_and_values_speculate_and_give_mlx_lms_tokens(bits, tmp_path, steady_step_costs):
    """Quantized KV caches are cut back like float ones: with speculation, greedy rows give what mlx_lm's
    generate_step gives alone with its own QuantizedKVCache."""
    from mlx_nb.compat.reference import quantized_cache

    path = write_tiny("qwen3", tmp_path / "qwen3", seed=1, variant={"head_dim": 32, "hidden_size": 128})
    loaded = load_model(str(path))
    texts = _texts(bits, 6)
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), MAX_TOKENS,
                         quantized_cache(loaded, bits, 32)) for t in texts]
    with Engine(str(path), wait=True, prefix_cache=False, kv_bits=bits, kv_group_size=32) as engine:
        got = []
        for pair in (texts[:2], texts[2:4], texts[4:]):
            handles = [engine.submit(prompt=t, max_tokens=MAX_TOKENS) for t in pair]
            got += [h.result(timeout=120).token_ids for h in handles]
        spec = engine.status()["speculation"]
    assert got == want
    assert spec["accepted_tokens"] > 0 and spec["speculative_steps"] > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_speculative_sampling_keeps_the_distribution(seed):
    """accept_sampled against the distribution computed in float64 NumPy: over many draws of a random
    row (random logits, a random two-token draft), the first token is distributed as p0, and the
    second, when the first is the draft's, as p1 (chi-square goodness of fit, p < 1e-4 would fail);
    the refused draft token is never the replacement."""
    import mlx.core as mx

    from mlx_nb.engine.sampling.samplers import SamplingParams, TokenSampler
    from mlx_nb.engine.speculation.prompt_lookup import accept_sampled

    rng = np.random.default_rng(seed)
    vocab, temperature = 6, float(rng.uniform(0.5, 1.5))
    logits = rng.standard_normal((3, vocab)) * 1.5
    draft = [int(x) for x in rng.choice(vocab, size=2)]
    p = np.exp(logits / temperature)
    p /= p.sum(axis=-1, keepdims=True)
    sampler = TokenSampler(SamplingParams(temperature=temperature), seeded=False)
    mx.random.seed(seed)
    firsts, seconds = [], []
    for _ in range(6000):
        kept, after = accept_sampled(sampler, mx.array(logits.astype(np.float32)), draft)
        tokens = [*draft[:kept], after]
        if kept < len(draft):
            assert after != draft[kept]
        firsts.append(tokens[0])
        if tokens[0] == draft[0]:
            seconds.append(tokens[1])
    for sample, want in ((firsts, p[0]), (seconds, p[1])):
        counts = np.bincount(sample, minlength=vocab)
        expected = want * len(sample)
        keep = expected >= 5
        stat = float((((counts - expected) ** 2 / np.maximum(expected, 1e-12))[keep]).sum())
        df = int(keep.sum()) - 1
        if sample is seconds and df < 1:  # the draft's first token is too rare to test what follows it
            continue
        critical = df * (1 - 2 / (9 * df) + 3.72 * (2 / (9 * df)) ** 0.5) ** 3
        assert stat < critical, (stat, critical, counts, expected)


def test_sampled_rows_keep_their_distribution_with_speculation(tmp_path, steady_step_costs):
    """Through the engine: sampled rows speculate (proposals kept and refused) and the tokens of 60
    sampled answers with speculation are distributed as those of 60 without (chi-square, p < 1e-4
    would fail)."""
    import mlx.core as mx

    path = write_tiny("qwen3", tmp_path / "qwen3", seed=1)
    text = "3 1 4 1 5 9 2 6 5 3 5 8 9 7 9 3 1 4 1 5 9 2 6 5 3 5"
    settings = dict(max_tokens=48, temperature=0.08)  # loops, mostly: proposals kept and refused

    def answers(speculation: bool) -> tuple[list[int], dict]:
        mx.random.seed(11)
        with Engine(str(path), wait=True, prefix_cache=False, speculation=speculation, max_batch=2) as engine:
            tokens = []
            for _ in range(30):
                pair = [engine.submit(prompt=text, **settings) for _ in range(2)]
                tokens += [t for h in pair for t in h.result(timeout=120).token_ids[1:]]
            return tokens, engine.status()["speculation"] or {}

    plain, _ = answers(False)
    spec_tokens, spec = answers(True)
    assert 0 < spec["accepted_tokens"] < spec["proposed_tokens"], spec
    differs, stat, critical = samples_differ(plain, spec_tokens)
    assert not differs, (stat, critical)
