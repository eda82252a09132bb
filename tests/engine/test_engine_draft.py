"""Speculation with a draft model (engine/speculation/draft.py): the rows of the shared batch verify a small model's
greedy guesses. Greedy rows give exactly mlx_lm's generate_step tokens alone, whether the draft is
always right (the model itself), mostly right (the model's weights with noise added) or unrelated;
sampled rows keep their distribution; a draft that cannot serve is left out with its reason in status.

On tiny models a draft costs as much as the model, so the cost model rightly never speculates with a
wrong draft: the tests that need refused guesses make every step propose 4 tokens (`forced_width`).
"""

import shutil

import numpy as np
import pytest

from chi_square import samples_differ
from mlx_nb import Engine
from mlx_nb.compat.configs import write_tiny
from mlx_nb.engine.speculation import prompt_lookup as speculation
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.models import load_model
from reference import reply_tokens
from step_clock import steady_step_costs  # noqa: F401  (a fixture)

MAX_TOKENS = 40


def _noisy_copy(path, dest, scale: float, seed: int):
    """The model at `path` with Gaussian noise of `scale` times each tensor's spread added: a draft
    that agrees with it on most tokens, not all."""
    import mlx.core as mx

    shutil.copytree(path, dest)
    weights = mx.load(str(dest / "model.safetensors"))
    rng = np.random.default_rng(seed)
    noisy = {}
    for name, w in weights.items():
        a = np.array(w.astype(mx.float32))
        noisy[name] = mx.array(a + rng.normal(0, scale * (a.std() + 1e-6), a.shape).astype(np.float32)).astype(w.dtype)
    mx.save_safetensors(str(dest / "model.safetensors"), noisy)
    return dest


def _texts(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(str(x) for x in rng.integers(0, 30, size=rng.integers(2, 40))) for _ in range(n)]


@pytest.fixture
def forced_width(monkeypatch):
    """Every step that has a plain step's time proposes 4 tokens a row, whatever the rows' rates."""
    def best_width(self, rates, lengths, pending_known=False):
        return min(4, max(lengths)) if self.plain_s.get(len(rates)) is not None else 0

    monkeypatch.setattr(speculation.PromptLookup, "best_width", best_width)


def _served(path, draft, texts, budgets, rows_per_batch) -> tuple[list, dict]:
    with Engine(str(path), wait=True, prefix_cache=False, draft_model=str(draft)) as engine:
        got = []
        for i in range(0, len(texts), rows_per_batch):
            handles = [engine.submit(prompt=t, max_tokens=m)
                       for t, m in zip(texts[i:i + rows_per_batch], budgets[i:i + rows_per_batch])]
            got += [h.result(timeout=120).token_ids for h in handles]
        status = engine.status()
        spec, memory = status["speculation"], status["memory"]
        # the draft's weights are held beside the model's, and what the registry's budget counts has both
        assert memory["draft_weights_bytes"] == spec["draft_weights_bytes"] > 0
        assert engine.weights_bytes == memory["weights_bytes"] + memory["draft_weights_bytes"]
        return got, spec


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_rows_give_mlx_lms_tokens_with_a_draft_that_is_always_right(seed, tmp_path, steady_step_costs):
    path = write_tiny("qwen3", tmp_path / "model", seed=seed)
    loaded = load_model(str(path))
    texts = _texts(seed, 6)
    budgets = [MAX_TOKENS - 5 * (i % 3) for i in range(len(texts))]
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), m) for t, m in zip(texts, budgets)]
    for rows in (1, 3):
        got, spec = _served(path, path, texts, budgets, rows)
        assert got == want, f"{rows} row(s) a batch"
        assert spec["method"] == "draft model" and spec["speculative_steps"] > 0
        drafted = spec["by_source"]["draft"]  # (where a row repeats itself, prompt lookup guesses instead)
        assert drafted["accepted_tokens"] == drafted["proposed_tokens"] > 0, spec
        assert spec["draft_rows"] == 0 and spec["draft_cache_bytes"] == 0, "finished rows' draft caches are dropped"


@pytest.mark.parametrize("arch,seed,noise", [("qwen3", 4, 0.3), ("phi3", 5, 0.6), ("qwen2", 6, 2.0)])
def test_greedy_rows_give_mlx_lms_tokens_with_a_draft_that_is_partly_wrong(arch, seed, noise, tmp_path, forced_width):
    """Drafts right on some tokens and wrong on others (noise 2.0: nearly always wrong): rows keep
    different numbers of guesses in one step, and their draft caches are cut back to what was kept."""
    path = write_tiny(arch, tmp_path / "model", seed=seed)
    draft = _noisy_copy(path, tmp_path / "draft", noise, seed)
    loaded = load_model(str(path))
    texts = _texts(seed + 20, 6)
    budgets = [MAX_TOKENS - 5 * (i % 3) for i in range(len(texts))]
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), m) for t, m in zip(texts, budgets)]
    for rows in (1, 3):
        got, spec = _served(path, draft, texts, budgets, rows)
        assert got == want, f"{rows} row(s) a batch"
        assert spec["proposed_tokens"] > spec["accepted_tokens"], spec
        if noise < 1:
            assert spec["accepted_tokens"] > 0, spec


def test_a_row_that_repeats_itself_takes_the_lookups_guess_and_the_draft_catches_up(tmp_path, forced_width):
    """Rows whose prompts repeat a run of numbers: where a row's last four tokens occurred before,
    its guess is prompt lookup's (no draft forward), elsewhere the draft's; the draft's cache catches
    up on the tokens it did not guess. Greedy rows still give mlx_lm's tokens alone."""
    path = write_tiny("qwen3", tmp_path / "model", seed=8)
    draft = _noisy_copy(path, tmp_path / "draft", 0.3, 8)
    loaded = load_model(str(path))
    runs = [" ".join(str(x) for x in range(a, a + n)) for a, n in ((3, 6), (20, 5), (11, 8))]
    texts = [f"{run} {run} {run.rsplit(' ', 2)[0]}" for run in runs] + _texts(9, 3)
    budgets = [MAX_TOKENS] * len(texts)
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, t, chat=False), m) for t, m in zip(texts, budgets)]
    got, spec = _served(path, draft, texts, budgets, 3)
    assert got == want
    sources = spec["by_source"]
    assert sources["lookup"]["proposed_tokens"] > 0 and sources["draft"]["proposed_tokens"] > 0, spec
    assert sources["lookup"]["accepted_tokens"] > 0, spec  # the repeated runs go on as they went before


def test_sampled_rows_keep_their_distribution_with_a_draft(tmp_path, forced_width):
    """60 sampled answers with a mostly-right draft are distributed as 60 without speculation
    (chi-square, p < 1e-4 would fail), with guesses both kept and refused."""
    import mlx.core as mx

    path = write_tiny("qwen3", tmp_path / "model", seed=1)
    draft = _noisy_copy(path, tmp_path / "draft", 0.3, 1)
    text = "3 1 4 1 5 9 2 6 5 3 5 8 9 7 9 3 1 4 1 5 9 2 6 5 3 5"
    settings = dict(max_tokens=40, temperature=0.3)

    def answers(**options) -> tuple[list[int], dict]:
        mx.random.seed(11)
        with Engine(str(path), wait=True, prefix_cache=False, max_batch=2, **options) as engine:
            tokens = []
            for _ in range(30):
                pair = [engine.submit(prompt=text, **settings) for _ in range(2)]
                tokens += [t for h in pair for t in h.result(timeout=120).token_ids[1:]]
            return tokens, engine.status()["speculation"] or {}

    plain, _ = answers(speculation=False)
    drafted, spec = answers(draft_model=str(draft))
    assert spec["method"] == "draft model" and 0 < spec["accepted_tokens"] < spec["proposed_tokens"], spec
    differs, stat, critical = samples_differ(plain, drafted)
    assert not differs, (stat, critical)


@pytest.mark.parametrize("draft,why", [
    ("smollm2-135m-instruct", "tokenizer differs"),
    ("tiny-gemma3", "cannot be cut off"),
    ("/nowhere/draft", "not found"),
])
def test_a_draft_that_cannot_serve_is_left_out_and_status_says_why(draft, why, tmp_path):
    path = write_tiny("qwen3", tmp_path / "model", seed=1)
    loaded = load_model(str(path))
    text = "5 4 3 2 1"
    want = reply_tokens(loaded, encode_prompt(loaded.tokenizer, text, chat=False), 24)
    with Engine(str(path), wait=True, prefix_cache=False, draft_model=draft) as engine:
        assert engine.submit(prompt=text, max_tokens=24).result(timeout=120).token_ids == want
        spec = engine.status()["speculation"]
        assert engine.status()["memory"]["draft_weights_bytes"] == 0  # nothing held for a draft left out
    assert spec["method"] == "prompt lookup" and why in spec["draft_note"] and "\n" not in spec["draft_note"]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_rows_draft_cache_follows_its_tokens_through_kept_and_refused_guesses(seed, tmp_path):
    """Row by row, as verification goes: each draft equals the draft model's own greedy tokens after
    the row's tokens (mlx_lm's generate_step from scratch), though its cache was read once and cut
    back wherever the served model refused a guess and put another token in its place."""
    from mlx_nb.engine.speculation.draft import DraftModel, vocab_size

    path = write_tiny("qwen3", tmp_path / "draft", seed=seed)
    loaded = load_model(str(path))
    drafter = DraftModel(loaded, vocab_size(loaded))
    rng = np.random.default_rng(seed)
    rows = {uid: [int(t) for t in rng.integers(0, 200, size=rng.integers(1, 30))] for uid in (1, 2)}
    refused = 0
    for _ in range(12):
        for uid, context in rows.items():
            k = int(rng.integers(1, 6))
            got = drafter.draft(uid, context, k)
            assert got == reply_tokens(loaded, context, k), (uid, len(context))
            kept = int(rng.integers(0, k + 1))  # as a verification would: a run kept, then another token
            other = int(rng.integers(0, 200))
            refused += kept < k and other != got[kept]
            context += got[:kept] + [other]
    assert refused > 5
    drafter.forget([2])
    assert list(drafter.rows) == [2]
