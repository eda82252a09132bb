"""Constrained decoding in the shared batch (engine/sampling/constrained.py): generated JSON schemas, regexes
and grammars hold on the real default model and a tiny one at temperature 1.0; unconstrained rows
of the same batch get exactly the tokens generate_step gives them alone; a row whose output leaves
its grammar ends alone; a schema llguidance cannot compile is a one-line RequestError at submit."""

import json
import random
import re

import jsonschema
import pytest

from mlx_nb import Engine
from mlx_nb.api.constraint_fields import constraint_of
from mlx_nb.engine.sampling.constrained import Constraint, tool_call
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.engine.types import RequestError
from mlx_nb.models import load_model
from held import held
from reference import reply_tokens

WORDS = ["name", "age", "city", "tags", "score", "kind", "items", "ok", "note", "id", "size", "level"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema of nested objects, arrays, enums, bounded numbers and optional fields."""
    kinds = ["integer", "number", "string", "boolean", "enum"] + (["object", "array"] * 2 if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "object":
        names = rng.sample(WORDS, rng.randint(1, 4))
        props = {n: random_schema(rng, depth + 1) for n in names}
        required = [n for n in names if rng.random() < 0.6]  # the others are optional
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": rng.randint(0, 1), "maxItems": 3}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, "x y", True], rng.randint(2, 4))}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "number":
        low = rng.uniform(-10, 10)
        return {"type": "number", "minimum": round(low, 2), "maximum": round(low + rng.uniform(0, 20), 2)}
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(2, 10)}
    return {"type": "boolean"}


def schemas(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        s = random_schema(rng)
        if s.get("type") == "object":
            out.append(s)
    return out


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("model,count", [("tiny-llama", 50), ("smollm2-135m-instruct", 50)])
def test_generated_schemas_hold_at_temperature_one(model, count):
    with Engine(model, wait=True) as engine:
        cases = schemas(count, seed=hash(model) % 1000)
        handles = [engine.submit(messages=[{"role": "user", "content": "Describe a thing as JSON."}],
                                 max_tokens=400, temperature=1.0, seed=i, constraint=constraint_of(fmt(s)))
                   for i, s in enumerate(cases)]
        for schema, handle in zip(cases, handles):
            result = handle.result(timeout=600)
            assert result.finish_reason == "stop", (schema, result.text, result.error)
            jsonschema.validate(json.loads(result.text), schema)


def test_json_object_and_strict_schemas_on_the_default_model():
    """json_object: any object (nothing bounds it: SmolLM2 sometimes nests or names keys until its
    budget, so only the replies that end are checked); strict: an object the schema does not close
    (pydantic leaves additionalProperties out) gets no keys beyond its own."""
    open_schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
    with Engine("smollm2-135m-instruct", wait=True) as engine:
        ask = [{"role": "user", "content": "Name a city as JSON."}]
        objects = [engine.submit(messages=ask, max_tokens=200, temperature=0.5, seed=s,
                                 constraint=constraint_of({"type": "json_object"})) for s in range(6)]
        strict = [engine.submit(messages=ask, max_tokens=200, temperature=1.0, seed=s, constraint=constraint_of({
            "type": "json_schema", "json_schema": {"name": "c", "schema": open_schema, "strict": True}})) for s in range(4)]
        ended = [r for r in (h.result(timeout=300) for h in objects) if r.finish_reason == "stop"]
        assert ended and all(isinstance(json.loads(r.text), dict) for r in ended)
        for h in strict:
            r = h.result(timeout=300)
            assert r.finish_reason == "stop" and set(json.loads(r.text)) == {"city"}, r.text


def test_free_rows_of_a_constrained_batch_equal_generate_step_alone():
    prompts = ["a", "one of middle length", "x y z", "a much longer prompt than the others, " * 3]
    loaded = load_model("tiny-llama")
    want = [reply_tokens(loaded, encode_prompt(loaded.tokenizer, p, chat=False), 12) for p in prompts]
    del loaded
    cases = schemas(4, seed=3)
    with Engine("tiny-llama", wait=True) as engine:
        handles = []
        with held(engine):  # all eight reach the engine at one step: they decode as one batch
            for i, p in enumerate(prompts):  # interleaved: constrained and free rows side by side
                handles.append(engine.submit(prompt=p, max_tokens=12))
                handles.append(engine.submit(prompt=p, max_tokens=200, temperature=1.0, seed=i,
                                             constraint=constraint_of(fmt(cases[i]))))
        results = [h.result(timeout=120) for h in handles]
        assert engine.status()["peak_batch_size"] == 8
    assert [r.token_ids for r in results[0::2]] == want
    for schema, r in zip(cases, results[1::2]):
        assert r.finish_reason == "stop", r.text
        jsonschema.validate(json.loads(r.text), schema)


def test_regex_grammar_and_tool_call_constraints():
    with Engine("tiny-llama", wait=True) as engine:
        def run(constraint, **kw):
            r = engine.submit(prompt="go", max_tokens=120, temperature=1.0, constraint=constraint, **kw).result(timeout=60)
            assert r.finish_reason == "stop", (r.text, r.error)
            return r.text

        for seed in range(5):
            assert re.fullmatch(r"[A-Z][a-z]{2,6}-[0-9]{3}", run(constraint_of(guided_regex=r"[A-Z][a-z]{2,6}-[0-9]{3}"), seed=seed))
            text = run(constraint_of(grammar='root ::= "yes" | "no" | ("maybe " [0-9])'), seed=seed)  # GBNF
            assert text in ("yes", "no") or re.fullmatch(r"maybe [0-9]", text)
            lark = run(constraint_of(guided_grammar='start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'), seed=seed)
            assert re.fullmatch(r"\(\d{1,3}(,\d{1,3})*\)", lark)
        params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "days"], "additionalProperties": False}
        for seed in range(5):
            text = run(tool_call([("get_weather", params), ("other", None)], ("<tool_call>", "</tool_call>")), seed=seed)
            body = re.fullmatch(r"<tool_call>\n?(.*)\n?</tool_call>", text, re.S).group(1)
            call = json.loads(body)
            assert call["name"] in ("get_weather", "other")
            if call["name"] == "get_weather":
                jsonschema.validate(call["arguments"], params)


def test_a_row_that_leaves_its_grammar_ends_alone_and_the_batch_goes_on():
    """The caller's own sampler picks a token the grammar forbids (a dead end for the matcher):
    that request ends with an error naming the grammar; its neighbour finishes as it would alone."""
    loaded = load_model("tiny-llama")
    want = reply_tokens(loaded, encode_prompt(loaded.tokenizer, "x y z", chat=False), 12)
    del loaded
    import mlx.core as mx

    with Engine("tiny-llama", wait=True) as engine:
        forbidden = engine.loaded.tokenizer.encode("z", add_special_tokens=False)[0]
        rogue = engine.submit(prompt="go", max_tokens=20, constraint=constraint_of(guided_regex="[0-9]+"),
                              sampler=lambda logprobs: mx.full((logprobs.shape[0],), forbidden, dtype=mx.uint32))
        free = engine.submit(prompt="x y z", max_tokens=12)
        bad = rogue.result(timeout=60)
        assert bad.finish_reason == "error" and "grammar" in bad.error and "\n" not in bad.error
        assert free.result(timeout=60).token_ids == want


@pytest.mark.parametrize("kwargs,words", [
    ({"constraint": constraint_of(fmt({"type": "bogus"}))}, "Invalid type"),
    ({"constraint": Constraint("regex", "([a-z")}, "regex"),
    ({"constraint": constraint_of(guided_grammar="start: undefined_rule")}, "undefined_rule"),
])
def test_what_cannot_compile_is_a_one_line_request_error(kwargs, words):
    with Engine("tiny-llama", wait=True) as engine:
        with pytest.raises(RequestError) as err:
            engine.submit(prompt="go", **kwargs)
        assert words.lower() in str(err.value).lower() and "\n" not in str(err.value)
        assert engine.submit(prompt="go", max_tokens=2).result(timeout=30).error is None  # it goes on serving


def test_one_constraint_at_a_time():
    with pytest.raises(RequestError, match="give one output constraint"):
        constraint_of(fmt({"type": "object"}), guided_regex="a+")
    with pytest.raises(RequestError, match="json_object or json_schema"):
        constraint_of({"type": "xml"})
    assert constraint_of({"type": "text"}) is None


def test_the_engine_reads_no_wire_name():
    """A constraint reaches the engine as a Constraint: the wire's response_format is read in
    mlx_nb.api.constraint_fields, and Engine.submit says so when handed one."""
    with Engine("tiny-llama", wait=True) as engine:
        with pytest.raises(TypeError, match="constraint=constraint_of"):
            engine.submit(prompt="go", response_format={"type": "json_object"})
        with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
            engine.submit(prompt="go", temprature=0.5)
