"""LoRA adapters per request: rows with different adapters and rows with none decode in one batch,
each row token for token what mlx_lm gives with that adapter alone (`mlx_lm.load(...,
adapter_path=...)` and `generate_step`, one request at a time).

The adapters are made as mlx_lm.lora makes them (tests/lora_fixture.py): its own LoRA layers over
the model, their parameters saved, with seeded random pairs large enough to change the tokens.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from mlx_nb import Engine
from mlx_nb.compat.configs import write_tiny
from mlx_nb.engine.inputs.prompts import encode_prompt
from mlx_nb.engine.types import RequestError
from mlx_nb.models import load_model
from mlx_nb.models.adapters import AdapterError

sys.path.insert(0, str(Path(__file__).parents[1]))
from lora_fixture import adapter_reference, make_adapter, mixed_batch, prompts_of  # noqa: E402

MAX_TOKENS = 12
# three adapters unlike each other: attention only and low rank; every projection; the last layer only
ADAPTERS = {
    "attn": dict(rank=2, scale=12.0, keys=["self_attn.q_proj", "self_attn.v_proj"]),
    "every": dict(rank=4, scale=8.0),
    "last": dict(rank=8, scale=6.0, num_layers=1),
}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3_text", "phi3", "olmo2"])
@pytest.mark.parametrize("seed", [1, 2])
def test_adapter_rows_and_plain_rows_in_one_batch_equal_mlx_lm_alone(arch, seed, tmp_path):
    model_path = write_tiny(arch, tmp_path / arch, seed=seed)
    adapters = {}
    for i, (name, spec) in enumerate(ADAPTERS.items()):
        keys = spec.get("keys")
        if arch == "phi3" and keys:  # phi3 holds q, k and v as one qkv_proj
            keys = ["self_attn.qkv_proj"]
        adapters[name] = make_adapter(model_path, tmp_path / name, seed=10 * seed + i,
                                      **{**spec, **({"keys": keys} if keys else {})})
    mixed_batch(model_path, adapters, seed, {})


@pytest.fixture(scope="module")
def llama_adapters(tmp_path_factory):
    from mlx_nb.models.sources import resolve

    root = tmp_path_factory.mktemp("lora")
    path = resolve("tiny-llama")
    return path, {name: make_adapter(path, root / name, seed=i, **spec) for i, (name, spec) in enumerate(ADAPTERS.items())}


def test_on_the_fused_kernel_layers_a_row_is_the_same_alone_and_in_any_batch(llama_adapters):
    """Quantized for the kernels, the decoder layers are fused (q/k/v, gate/up, norms and skips in
    the projections): each row's tokens are the same alone and beside any other rows."""
    path, adapters = llama_adapters
    texts = prompts_of(5, 9)
    names = [None, "attn", "every", "last", "attn", None, "every", "last", "last"]
    with Engine(str(path), wait=True, quantize=4) as engine:
        assert engine.status()["kernels"]["swapped"].get("decoder layer")
        for name, folder in adapters.items():
            engine.load_adapter(name, str(folder))
        alone = [engine.submit(prompt=t, max_tokens=MAX_TOKENS, adapter=n).result(timeout=60).token_ids
                 for t, n in zip(texts, names)]
        plain = [engine.submit(prompt=t, max_tokens=MAX_TOKENS).result(timeout=60).token_ids for t in texts]
        together = [engine.submit(prompt=t, max_tokens=MAX_TOKENS, adapter=n) for t, n in zip(texts, names)]
        assert [h.result(timeout=120).token_ids for h in together] == alone
        assert engine.status()["peak_batch_size"] > 1
    assert sum(a != p for a, p, n in zip(alone, plain, names) if n) >= 3, "the adapters change nothing"
    assert all(a == p for a, p, n in zip(alone, plain, names) if n is None)


def test_a_fused_projection_adds_each_rows_own_low_rank_term():
    """LoRAProjection on a packed projection called as a fused layer calls it (plain, normed input,
    skip connection, gated input), rows of two adapters and none: the result minus the projection
    alone is s (x' A) B for the adapter's rows and zero for the others, x' the normed or gated
    input, against a float64 NumPy computation."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_nb.kernels.layers import QLinear, RMSNorm
    from mlx_nb.models.adapters import Adapter
    from mlx_nb.models.lora import LoRAProjection, LoRARouter

    rng = np.random.default_rng(3)
    dims, outputs, rows = 64, 96, 5
    base = QLinear.from_linear(nn.Linear(dims, outputs), bits=4)
    router = LoRARouter(lambda uid: {0: "x", 2: "y", 3: "x"}.get(uid))
    router.adapters = {"x": None, "y": None}
    wrapped = LoRAProjection(base, router, outputs)
    pairs = {}
    for name, scale, (start, stop) in (("x", 2.0, (0, 32)), ("x", 2.0, (48, 96)), ("y", 0.5, (0, 96))):
        a = rng.normal(size=(dims, 3)).astype(np.float32)
        b = rng.normal(size=(3, stop - start)).astype(np.float32)
        wrapped.add(name, scale, start, stop, mx.array(a), mx.array(b))
        pairs.setdefault(name, []).append((scale, start, stop, a.astype(np.float64), b.astype(np.float64)))
    norm = RMSNorm(mx.array(rng.normal(size=dims).astype(np.float32)), 1e-5)
    x = mx.array(rng.normal(size=(rows, 2, dims)).astype(np.float32))
    x2 = mx.array(rng.normal(size=(rows, 2, 2 * dims)).astype(np.float32))
    residual = mx.array(rng.normal(size=(rows, 2, outputs)).astype(np.float32))
    x64 = np.array(x, dtype=np.float64)
    w64 = np.array(norm.weight, dtype=np.float64)
    normed = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w64
    g, u = np.split(np.array(x2, dtype=np.float64), 2, axis=-1)
    gated = g / (1 + np.exp(-g)) * u
    cases = [("plain", x, {}, x64), ("norm", x, {"norm": norm}, normed), ("residual", x, {"residual": residual}, x64)]
    for what, given, kwargs, inputs in cases:
        with router.rows(list(range(rows))):
            got = np.array(wrapped(given, **kwargs), dtype=np.float64)
        alone = np.array(base(given, **kwargs), dtype=np.float64)
        want = np.zeros_like(alone)
        for row, name in {0: "x", 2: "y", 3: "x"}.items():
            for scale, start, stop, a, b in pairs[name]:
                want[row, :, start:stop] += scale * (inputs[row] @ a) @ b
        np.testing.assert_allclose(got - alone, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=what)
        assert np.array_equal(got[[1, 4]], alone[[1, 4]]), what  # rows without an adapter: untouched
    down = QLinear.from_linear(nn.Linear(dims, outputs), bits=4)
    wrapped_down = LoRAProjection(down, router, outputs)
    a = rng.normal(size=(dims, 2)).astype(np.float32)
    b = rng.normal(size=(2, outputs)).astype(np.float32)
    wrapped_down.add("y", 3.0, 0, outputs, mx.array(a), mx.array(b))
    with router.rows(list(range(rows))):
        got = np.array(wrapped_down(x2, gate=True), dtype=np.float64)
    alone = np.array(down(x2, gate=True), dtype=np.float64)
    want = np.zeros_like(alone)
    want[2] = 3.0 * (gated[2] @ a.astype(np.float64)) @ b.astype(np.float64)
    np.testing.assert_allclose(got - alone, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg="gate")


def test_adapters_load_and_unload_at_runtime_and_bad_ones_are_refused(llama_adapters, tmp_path):
    import json

    from mlx_nb.models.lora import LoRAProjection

    path, adapters = llama_adapters
    text = "12 34 56"
    with Engine(str(path), wait=True) as engine:
        plain = engine.submit(prompt=text, max_tokens=MAX_TOKENS).result(timeout=60).token_ids
        with pytest.raises(RequestError, match="no adapter named every is loaded"):
            engine.submit(prompt=text, adapter="every")
        info = engine.load_adapter("every", str(adapters["every"]))
        assert (info["rank"], info["scale"], info["projections"]) == (4, 8.0, 14)
        from safetensors.numpy import load_file

        raw = sum(v.nbytes for v in load_file(str(adapters["every"] / "adapters.safetensors")).values())
        joined = sum(a.nbytes + b.nbytes for _, m in engine.loaded.model.named_modules()
                     if isinstance(m, LoRAProjection) for a, b in m.pairs.values())
        assert info["bytes"] == engine.adapter_bytes == raw + joined  # what the budget counts is what is held
        assert [a["name"] for a in engine.status()["adapters"]] == ["every"]
        adapted = engine.submit(prompt=text, max_tokens=MAX_TOKENS, adapter="every").result(timeout=60).token_ids
        assert adapted != plain
        with pytest.raises(AdapterError, match="already loaded"):
            engine.load_adapter("every", str(adapters["every"]))
        # one in use is not taken away: it decodes (end of text barred) until aborted
        eos = engine.loaded.tokenizer.eos_token_ids
        running = engine.submit(prompt=text, max_tokens=4000, adapter="every", logit_bias={t: -100 for t in eos})
        next(iter(running))
        with pytest.raises(RequestError, match="in use by 1 request"):
            engine.unload_adapter("every")
        running.abort()
        running.result(timeout=60)
        engine.unload_adapter("every")
        assert not any(isinstance(m, LoRAProjection) for _, m in engine.loaded.model.named_modules())
        assert engine.submit(prompt=text, max_tokens=MAX_TOKENS).result(timeout=60).token_ids == plain
        # bad folders: one line each, saying why
        other = write_tiny("llama", tmp_path / "wide", variant={"hidden_size": 96})
        wrong = make_adapter(other, tmp_path / "wrong", seed=1, keys=["self_attn.q_proj"])
        with pytest.raises(AdapterError, match="does not fit this model: model.layers.0.self_attn.q_proj maps 64"):
            engine.load_adapter("wrong", str(wrong))
        for kind, change in (("dora", {"fine_tune_type": "dora"}), ("full", {"fine_tune_type": "full"}),
                             ("noscale", {"lora_parameters": {"rank": 4}})):
            bad = tmp_path / kind
            bad.mkdir()
            (bad / "adapters.safetensors").write_bytes((adapters["attn"] / "adapters.safetensors").read_bytes())
            config = json.loads((adapters["attn"] / "adapter_config.json").read_text())
            (bad / "adapter_config.json").write_text(json.dumps({**config, **change}))
            with pytest.raises(AdapterError) as err:
                engine.load_adapter(kind, str(bad))
            assert "\n" not in str(err.value) and ("fine-tune" in str(err.value) or "scale" in str(err.value))
        with pytest.raises(AdapterError, match="not an mlx_lm adapter folder"):
            engine.load_adapter("nothing", str(tmp_path))
        assert engine.status()["adapters"] == []
        assert engine.submit(prompt=text, max_tokens=MAX_TOKENS).result(timeout=60).token_ids == plain


@pytest.mark.parametrize("seed", [3, 4])
def test_adapter_rows_reuse_their_own_prefixes_never_the_base_models_nor_an_earlier_loads(llama_adapters, seed):
    """An adapter row's keys and values are not the base model's: a conversation growing turn by
    turn with an adapter hits the entries its own earlier turns stored, never one a base row stored
    for the same text, and an adapter loaded again under the same name with other weights never
    meets the old load's entries. Every reply is mlx_lm's with that adapter (or none) alone."""
    path, adapters = llama_adapters
    rng = np.random.default_rng(seed)
    turns = [" ".join(str(x) for x in rng.integers(0, 99, size=8))]
    for _ in range(4):  # each turn the one before and more
        turns.append(turns[-1] + " " + " ".join(str(x) for x in rng.integers(0, 99, size=3)))
    tokenizer = load_model(str(path)).tokenizer
    prompts = [encode_prompt(tokenizer, t, chat=False) for t in turns]
    # (turn, adapter as loaded then): the base model reads turn 0 first; the adapter's turns follow
    plan = [(0, None), (1, "every"), (2, "every"), (3, None), (3, "every"), (4, "every/attn")]
    want = {}
    for folder in (None, "every", "attn"):
        want[folder] = adapter_reference(path, None if folder is None else adapters[folder], prompts, MAX_TOKENS)
    assert want["every"] != want[None] and want["attn"] != want["every"], "the adapters change nothing"
    with Engine(str(path), wait=True) as engine:
        engine.load_adapter("every", str(adapters["every"]))
        kinds = []
        for turn, who in plan:
            if who == "every/attn":  # the same name, other weights
                engine.unload_adapter("every")
                engine.load_adapter("every", str(adapters["attn"]))
            h = engine.submit(prompt=turns[turn], max_tokens=MAX_TOKENS, adapter=None if who is None else "every")
            got = h.result(timeout=60)
            assert got.error is None, got.error
            assert got.token_ids == want[None if who is None else who.split("/")[-1]][turn], (turn, who)
            (insert,) = [e for e in engine.events() if e["kind"] == "insert" and h.id in e["requests"]]
            kinds.append(insert["detail"]["prefix_hit"])
    # the adapter's first turn meets only the base model's entries: a miss; its later turns hit its own;
    # the base row of turn 3 hits the base entry of turn 0; the new load meets nothing of the old one
    assert kinds[0] == "miss" and kinds[1] == "miss" and kinds[5] == "miss", kinds
    assert kinds[2] != "miss" and kinds[3] != "miss" and kinds[4] != "miss", kinds
