"""A thinking model's reasoning, kept apart from its answer (engine/text/reasoning.py): the text split on
every chunking, each family's markers found from the template and vocabulary, and through the
engine: reasoning and answer apart, streamed and whole; stop strings and a JSON schema applied to
the answer only; a thinking budget that closes the reasoning at its count; no reasoning when the
template is asked for none; harmony channels."""

import json
import random

import jsonschema
import pytest

from forcing import forcing
from mlx_nb import Engine
from mlx_nb.api.constraint_fields import constraint_of
from mlx_nb.engine.text.reasoning import HARMONY, MAGISTRAL, THINK, ReasoningSplit, reasoning_format
from mlx_nb.models import load_model

WORDS = ["plan", "the", "<", "answer", "think", "/", ">", "\n", "x", "[", "]", "|", "42", " ", "end"]


def _split(fmt, text, inside, rng):
    s = ReasoningSplit(fmt, inside)
    answer, reasoning = [], []
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        a, r = s.feed(text[i:i + n])
        answer.append(a)
        reasoning.append(r)
        i += n
    a, r = s.feed("", final=True)
    return "".join(answer + [a]), "".join(reasoning + [r])


def _words(rng, n):
    """Random text that never spells a marker (it may hold marker-like fragments)."""
    out = "".join(rng.choice(WORDS) for _ in range(n)).strip("\n")
    for m in ("<think>", "</think>", "[THINK]", "[/THINK]", "<|"):
        out = out.replace(m, "")
    return out or "x"


@pytest.mark.parametrize("seed", range(30))
def test_the_split_is_the_same_on_every_chunking(seed):
    rng = random.Random(seed)
    reasoning, answer = _words(rng, rng.randint(1, 30)), _words(rng, rng.randint(1, 30))
    cases = [
        (THINK, f"<think>\n{reasoning}\n</think>\n\n{answer}", False),
        (THINK, f"{reasoning}\n</think>\n\n{answer}", True),  # the prompt opened the block
        (MAGISTRAL, f"[THINK]{reasoning}[/THINK]{answer}", False),
        (HARMONY, f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final"
                  f"<|message|>{answer}", False),
    ]
    for fmt, text, inside in cases:
        got = _split(fmt, text, inside, rng)
        assert got == (answer.lstrip("\n"), reasoning.strip("\n")), (fmt.name, text)
    no_reasoning = _words(rng, 20)
    assert _split(THINK, no_reasoning, False, rng) == (no_reasoning, "")


def test_the_family_comes_from_template_and_vocabulary():
    assert reasoning_format(load_model("tiny-qwen3-think").tokenizer) == THINK
    assert reasoning_format(load_model("tiny-gpt-oss").tokenizer) == HARMONY
    # the same vocabulary (it holds <think>) with a template that writes no reasoning: not a thinking model
    assert reasoning_format(load_model("tiny-llama").tokenizer) is None


@pytest.fixture(scope="module")
def thinker():
    with Engine("tiny-qwen3-think", wait=True) as engine:
        yield engine


def _ids(engine, text):
    return engine.loaded.tokenizer.encode(text, add_special_tokens=False)


def _eos(engine):
    return sorted(engine.loaded.tokenizer.eos_token_ids)[0]


def test_reasoning_and_answer_arrive_apart(thinker):
    ids = _ids(thinker, "a plan\n</think>\n\nthe answer") + [_eos(thinker)]
    assert thinker.status()["reasoning"] == "think"
    h = thinker.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=len(ids),
                       logits_processors=[forcing(ids)])
    deltas = list(h)
    r = h.result()
    assert (r.reasoning, r.text) == ("a plan", "the answer")
    kinds = ["r" if d.reasoning else "t" for d in deltas if d.reasoning or d.text]
    assert kinds == sorted(kinds, key=lambda k: k != "r")  # every reasoning piece before any answer piece
    assert "</think>" not in "".join(d.text + d.reasoning for d in deltas)


def test_stop_strings_apply_to_the_answer_only(thinker):
    ids = _ids(thinker, "first STOP then\n</think>\n\nanswer STOP rest") + [_eos(thinker)]
    r = thinker.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=len(ids), stop=["STOP"],
                       logits_processors=[forcing(ids)]).result()
    assert r.reasoning == "first STOP then" and r.text == "answer " and r.finish_reason == "stop"


@pytest.mark.parametrize("budget", [0, 5, 16])
def test_a_thinking_budget_closes_the_reasoning_at_its_count(thinker, budget):
    end = _ids(thinker, "</think>")
    no_end = {end[0]: -100, _eos(thinker): -100}  # left alone, the model would not close it in time
    r = thinker.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=budget + 12, temperature=1.0,
                       seed=3, logit_bias=no_end, reasoning_budget=budget).result()
    tokens = r.token_ids
    assert tokens[budget:budget + len(end)] == end and end[0] not in tokens[:budget]
    assert "</think>" not in r.reasoning + r.text


def test_a_schema_holds_the_answer_and_not_the_reasoning(thinker):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    end = _ids(thinker, "</think>")[0]
    no_end = {end: -100, _eos(thinker): -100}  # the reasoning runs to its budget (the grammar still ends the answer)
    for seed in range(4):
        r = thinker.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=80, temperature=1.0, seed=seed,
                           logit_bias=no_end, reasoning_budget=12, constraint=constraint_of(fmt)).result()
        assert r.finish_reason == "stop", r
        jsonschema.validate(json.loads(r.text), schema)
        assert r.token_ids[12] == end and end not in r.token_ids[:12]  # 12 free tokens, then the answer


@pytest.mark.parametrize("model", ["tiny-qwen3-think", "tiny-gpt-oss"])
def test_a_reply_under_a_schema_that_would_end_in_its_reasoning_closes_it_and_answers(model):
    """A model that would stop inside its reasoning (here: leaning hard to its end-of-sequence
    tokens from two tokens into the reasoning on) gives, under a schema, a reasoning that closes and an
    answer the schema holds, both families; without one, the same lean ends the reply unanswered."""
    import mlx.core as mx

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema, "strict": True}}
    with Engine(model, wait=True) as engine:
        tok = engine.loaded.tokenizer
        stops = sorted(tok.eos_token_ids)
        # the reply opens harmony's reasoning itself; the Qwen3-style prompt opened it already
        opened = len(tok.encode(HARMONY.start, add_special_tokens=False)) if model == "tiny-gpt-oss" else 0
        prompt_len = []

        def ending(tokens, logits):
            prompt_len.append(prompt_len[0] if prompt_len else len(tokens))
            if len(tokens) - prompt_len[0] < opened + 2:
                return logits
            is_stop = mx.zeros(logits.shape[-1], dtype=mx.bool_).at[mx.array(stops)].add(True)
            return logits + 100.0 * is_stop.astype(logits.dtype)

        def ask(**kw):
            prompt_len.clear()
            return engine.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=120, temperature=1.0,
                                 seed=0, logits_processors=[ending], **kw).result()

        free = ask()
        assert free.finish_reason == "stop" and free.text == "" and free.reasoning, free
        held = ask(constraint=constraint_of(fmt))
        assert held.finish_reason == "stop" and held.reasoning, held
        jsonschema.validate(json.loads(held.text), schema)


def test_a_harmony_reply_that_takes_the_channel_marker_under_a_schema_opens_its_reasoning():
    """Under a constraint, a harmony reply's first token may be `<|channel|>` (the reasoning's
    start). A reply that takes it, then leans to another channel (`final`), is held to the rest of
    the reasoning's start marker: read as an answer that began with `<|channel|>`, which no schema
    allows, the request would fail."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema, "strict": True}}
    with Engine("tiny-gpt-oss", wait=True) as engine:
        tok = engine.loaded.tokenizer
        lean = tok.encode("<|channel|>final<|message|>", add_special_tokens=False)
        start = tok.encode("<|channel|>analysis<|message|>", add_special_tokens=False)
        calls = []

        def leaning(tokens, logits):
            """The model's wish: `lean`, one token a step (the constraint has the last word)."""
            import mlx.core as mx

            step = len(calls)
            calls.append(step)
            if step >= len(lean):
                return logits
            return logits + 100.0 * (mx.arange(logits.shape[-1]) == lean[step]).astype(logits.dtype)

        r = engine.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=24, temperature=0,
                          logits_processors=[leaning], constraint=constraint_of(fmt),
                          chat_template_kwargs={"reasoning_effort": "low"}).result()
        assert r.token_ids[:len(start)] == start, tok.decode(r.token_ids)
        assert r.finish_reason == "length" and r.reasoning


def test_thinking_off_gives_no_reasoning(thinker):
    start = _ids(thinker, "<think>")[0]
    h = thinker.submit(messages=[{"role": "user", "content": "hi"}], max_tokens=12, logit_bias={start: -100},
                       chat_template_kwargs={"enable_thinking": False})
    r = h.result()
    assert r.reasoning == "" and r.token_ids


def test_a_raw_completion_keeps_the_text_as_written(thinker):
    ids = _ids(thinker, "plan</think>answer") + [_eos(thinker)]
    r = thinker.submit(prompt="<think>", max_tokens=len(ids), logits_processors=[forcing(ids)],
                       split_reasoning=False).result()
    assert (r.reasoning, r.text) == ("", "plan</think>answer")


def test_harmony_channels_split_reasoning_from_answer():
    with Engine("tiny-gpt-oss", wait=True) as engine:
        assert engine.status()["reasoning"] == "harmony"
        tok = engine.loaded.tokenizer
        text = "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"
        ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|return|>")]
        h = engine.submit(messages=[{"role": "user", "content": "hello"}], max_tokens=len(ids),
                          logits_processors=[forcing(ids)], chat_template_kwargs={"reasoning_effort": "low"})
        r = h.result()
        assert (r.reasoning, r.text) == ("User greets.", "Hi!")
        prompt = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                         add_generation_prompt=True, reasoning_effort="low")
        assert "Reasoning: low" in prompt


def test_an_earlier_turns_reasoning_reaches_the_template_as_it_expects(thinker):
    """Qwen3's rule: reasoning after the last user message (the turn being continued) stays; earlier
    turns' goes. The reasoning arrives under the names templates read (reasoning_content, thinking)."""
    from mlx_nb.engine.inputs.messages import normalize_messages
    from mlx_nb.engine.inputs.prompts import render_chat

    tok = thinker.loaded.tokenizer
    kept = render_chat(tok, normalize_messages([
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "so far", "reasoning": "fresh thoughts"},
    ]))
    assert "fresh thoughts" in kept and "old thoughts" not in kept
