"""Several models on one server (mlx_nb/registry.py), through the unmodified openai SDK: requests
naming registered models (and LoRA adapters, `model@adapter`) load them on demand and each reply
equals that model (with that adapter) alone; the budget
unloads the least recently used idle model to make room and refuses a model that cannot fit with
a 503 that says why; an idle model is unloaded after its keep-alive; `models.list()` shows the
registry with each model's state."""

import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from live_server import serving
from mlx_nb import Engine
from mlx_nb.client import Client, ClientError
from mlx_nb.magics.tables import models_table

DEFAULT = "tiny-llama"
OTHERS = ["tiny-gemma3", "tiny-qwen3.5"]
PREFIX = 1_000_000  # each model's prefix-cache budget: counted against the memory budget
MAX = 10


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0, timeout=300)


def states(server) -> dict:
    return {m.id: getattr(m, "state", None) for m in sdk(server).models.list().data}


def ask(server, model: str, text: str, **extra) -> str:
    r = sdk(server).chat.completions.create(model=model, max_tokens=MAX, temperature=0,
                                            messages=[{"role": "user", "content": text}], extra_body=extra or None)
    assert r.model == model
    return r.choices[0].message.content


def alone(model: str, texts: list[str], adapters: dict = {}) -> list[str]:  # noqa: B006 - read only
    """`model`'s replies one at a time (`base@adapter`: with that adapter loaded on it)."""
    base, _, adapter = model.partition("@")
    with Engine(base, prefix_cache=False, wait=True) as engine:
        if adapter:
            engine.load_adapter(adapter, str(adapters[adapter]))
        return [engine.submit(messages=[{"role": "user", "content": t}], max_tokens=MAX,
                              adapter=adapter or None).result(timeout=120).text for t in texts]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict:
    """Three LoRA adapters of the default model, as mlx_lm.lora writes them (tests/lora_fixture.py)."""
    from lora_fixture import make_adapter
    from mlx_nb.models.sources import resolve

    root, path = tmp_path_factory.mktemp("adapters"), resolve(DEFAULT)
    specs = {"terse": dict(rank=2, keys=["self_attn.q_proj", "self_attn.v_proj"]), "wordy": dict(rank=4),
             "late": dict(rank=8, num_layers=1)}
    return {name: make_adapter(path, root / name, seed=i + 1, **spec) for i, (name, spec) in enumerate(specs.items())}


def streamed_lines(server, model: str, text: str, **extra) -> list[str]:
    """The raw SSE lines of a streamed chat (comments included), as any HTTP client reads them."""
    body = {"model": model, "max_tokens": MAX, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": text}], **extra}
    with server.http.stream("POST", f"{server.url}/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def streamed_text(lines: list[str]) -> str:
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def registered(models: list[str]) -> list[str]:
    return [f"--MLXExtension.models={m}" for m in models]  # a list option: one flag per item


def options(*extra: str) -> list[str]:
    return [*registered(OTHERS), f"--MLXExtension.prefix_cache_bytes={PREFIX}", *extra]


@pytest.mark.parametrize("seed", [3, 4])
def test_concurrent_chats_naming_three_models_and_three_adapters_each_answer_as_alone(tmp_path_factory, adapters,
                                                                                       seed):
    rng = random.Random(seed)
    named = [DEFAULT, *OTHERS, *(f"{DEFAULT}@{a}" for a in adapters)]
    asks = [(rng.choice(named), f"note {rng.randint(0, 10**6)}: " +
             " ".join(rng.choice("amber basalt cobalt dune ember fjord".split()) for _ in range(rng.randint(2, 9))))
            for _ in range(24)]
    want = {m: dict(zip([t for n, t in asks if n == m], alone(m, [t for n, t in asks if n == m], adapters)))
            for m in {n for n, _ in asks}}
    flags = [f"--MLXExtension.adapters={name}={folder}" for name, folder in adapters.items()]
    with serving(tmp_path_factory.mktemp("models"), DEFAULT, *options(*flags)) as server:
        listed = states(server)
        assert listed == {DEFAULT: "loaded", **{m: "available" for m in named[1:]}}, listed
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda a: ask(server, *a), asks))
        for (model, text), reply in zip(asks, got):
            assert reply == want[model][text], f"{model} answered differently beside the other models and adapters"
        used = {n.partition("@")[2] for n, _ in asks if "@" in n}
        assert {a["name"] for a in server.get("status")["adapters"]} == used  # read the first time a request named it
        assert {m: s for m, s in states(server).items() if "@" in m} == {
            f"{DEFAULT}@{a}": "loaded" if a in used else "available" for a in adapters}
        # the adapter as a field of its own; an unregistered adapter or base model: a 404 naming what is served
        assert ask(server, DEFAULT, "field or name", adapter="terse") == ask(server, f"{DEFAULT}@terse", "field or name")
        for wrong in (f"{DEFAULT}@nothing", "nothing@terse"):
            with pytest.raises(openai.NotFoundError, match=f"{DEFAULT}@terse"):
                ask(server, wrong, "hello")
        client = Client(server.url, server.key)  # loaded and unloaded at runtime through the model routes
        client.load(f"{DEFAULT}@late")
        assert states(server)[f"{DEFAULT}@late"] == "loaded" and client.model == f"{DEFAULT}@late"
        assert client.chat("hi", max_tokens=MAX).model == f"{DEFAULT}@late"  # the client's chats name it
        assert client.unload(f"{DEFAULT}@late")["unloaded_now"] and states(server)[f"{DEFAULT}@late"] == "available"
        status = server.get("status")
        registry = status["registry"]
        assert registry["used_bytes"] <= registry["budget_bytes"]
        assert status["memory"]["peak_bytes"] <= registry["budget_bytes"]  # MLX's peak, every model's arrays
        loaded = {m["name"] for m in registry["models"] if m["state"] == "loaded"}
        assert loaded == {n.partition("@")[0] for n, _ in asks}
        # each model has its own batch: the timeline draws one per loaded model, the default's first;
        # its events (and another model's, by name) carry each request's adapter
        svg = server.http.get(f"{server.url}/batch.svg", params={"lanes": 60}).text
        drawn = re.findall(r'class="model" data-model="([^"]+)"', svg)
        assert drawn[0] == DEFAULT and set(drawn) == loaded, drawn
        inserts = [e for e in server.get("events", stream=0) if e["kind"] == "insert"]
        assert {e["detail"].get("adapter") for e in inserts} >= used
        for other in loaded - {DEFAULT}:
            theirs = [e for e in server.get("events", stream=0, model=other) if e["kind"] == "insert"]
            assert len(theirs) == sum(n == other for n, _ in asks)
        from prometheus_client.parser import text_string_to_metric_families

        scraped = {f.name: f for f in text_string_to_metric_families(server.http.get(f"{server.url}/metrics").text)}
        ready = {s.labels["model"]: s.value for s in scraped["mlx_model_ready"].samples}
        assert ready == {m: 1.0 if m in loaded else 0.0 for m in [DEFAULT, *OTHERS]}
        reserved = {s.labels["model"]: s.value for s in scraped["mlx_model_reserved_bytes"].samples}
        assert all((reserved[m] > PREFIX) == (m in loaded) for m in OTHERS), reserved
        assert scraped["mlx_memory_budget_bytes"].samples[0].value == registry["budget_bytes"]


def test_the_budget_unloads_the_idle_model_keep_alive_unloads_and_too_big_is_a_503(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    big = root / "big-model"
    big.mkdir()
    (big / "config.json").write_text('{"model_type": "llama"}')
    with open(big / "model.safetensors", "wb") as f:  # a sparse file: its size, none of the disk
        f.truncate(64 * 2**20)
    # room for the default model and one more tiny one, not two
    budget = 2 * PREFIX + 370_000 + 800_000 + 200_000  # llama and gemma or qwen (each ~0.75 MB), not all three
    extra = (f"--MLXExtension.memory_budget={budget}", "--MLXExtension.keep_alive_s=600")  # nothing expires unasked
    (root / "server").mkdir()
    with serving(root / "server", DEFAULT, *registered([*OTHERS, f"big={big}"]),
                 f"--MLXExtension.prefix_cache_bytes={PREFIX}", *extra) as server:
        ask(server, OTHERS[0], "first")
        assert states(server)[OTHERS[0]] == "loaded"
        ask(server, OTHERS[1], "second")  # the first is idle: unloaded to make room
        listed = {m.id: m for m in sdk(server).models.list().data}
        assert listed[OTHERS[0]].state == "available" and listed[OTHERS[0]].unloaded == 1
        assert listed[OTHERS[1]].state == "loaded" and listed[DEFAULT].state == "loaded"
        table = repr(models_table(*(lambda c: (c.models(), DEFAULT, c.model_states()))(Client(server.url, server.key))))
        assert [line.split()[-2:] for line in table.splitlines()[3:7]] == [
            [DEFAULT, "loaded"], [OTHERS[0], "available"], [OTHERS[1], "loaded"], ["big", "available"]], table

        with pytest.raises(openai.APIStatusError) as info:
            ask(server, "big", "hello")
        assert info.value.status_code == 503 and "memory budget" in info.value.message
        assert "MLXExtension.memory_budget" in info.value.message
        assert ask(server, DEFAULT, "still serving")  # the refusal changed nothing

        client = Client(server.url, server.key)
        client.load(OTHERS[0])  # loaded on request, before any chat names it (the other idle one makes room)
        assert states(server)[OTHERS[0]] == "loaded" and states(server)[OTHERS[1]] == "available"
        assert client.unload(OTHERS[0])["unloaded_now"] and states(server)[OTHERS[0]] == "available"
        # a streamed request that waited for its model's load opened its stream: its mistake comes as the
        # stream's error event, the model loaded for the next request
        lines = streamed_lines(server, OTHERS[0], "hi", temperature=99)
        assert lines[0].startswith(f": loading {OTHERS[0]}: ") and lines[-1].startswith("data: {")
        assert "temperature" in json.loads(lines[-1][6:])["error"]["message"]
        assert states(server)[OTHERS[0]] == "loaded" and client.unload(OTHERS[0])["unloaded_now"]
        # an adapter is taken off a model without loading the model; a base model not served is a 404
        gone = server.http.delete(f"{server.url}/models/{OTHERS[0]}@any")
        assert gone.status_code == 200 and gone.json()["unloaded_now"] is False
        assert states(server)[OTHERS[0]] == "available"
        assert server.http.post(f"{server.url}/models/nothing@any").status_code == 404
        with pytest.raises(ClientError, match="default model"):
            client.unload(DEFAULT)
        # Ollama's keep_alive per request: a bad one is a 400; "1s" unloads the model once idle that long
        with pytest.raises(openai.BadRequestError, match="keep_alive"):
            ask(server, OTHERS[1], "hi", keep_alive="soon")
        ask(server, OTHERS[1], "brief", keep_alive="1s")
        assert {m.id: m for m in sdk(server).models.list().data}[OTHERS[1]].keep_alive_s == 1
        deadline = time.monotonic() + 60  # the sweep runs every 5 s here
        while states(server)[OTHERS[1]] != "available":
            assert time.monotonic() < deadline, "the idle model was never unloaded"
            time.sleep(0.25)
        assert states(server)[DEFAULT] == "loaded"  # pinned: never unloaded


def test_a_stream_keeps_decoding_while_another_model_loads(tmp_path_factory, record_property):
    """The default model streams a long answer; meanwhile a request names another model, which
    loads on its own thread. The stream goes on, by construction: a tiny llama with a 64k context
    and its end-of-text token barred streams until the load is done and 20 tokens more have come.
    The longest pause while the other model loaded is recorded, not asserted (timings are the bench's)."""
    import threading

    from mlx_nb.compat.configs import write_tiny
    from mlx_nb.models import load_model

    root = tmp_path_factory.mktemp("load-beside")
    long_llama = str(write_tiny("llama", root / "long-llama", 7, {"max_position_embeddings": 65536}))
    eos = {str(t): -100 for t in load_model(long_llama).tokenizer.eos_token_ids}
    (root / "server").mkdir()
    with serving(root / "server", long_llama, *options()) as server:
        stamps: list[float] = []
        loaded: dict = {}

        def load_other():  # streamed: the stream opens while the model loads, its progress as comments
            loaded["start"] = time.monotonic()
            loaded["lines"] = streamed_lines(server, OTHERS[1], "hello")
            loaded["end"] = time.monotonic()

        stream = sdk(server).chat.completions.create(
            model=long_llama, max_tokens=60000, temperature=0, stream=True, logit_bias=eos,
            messages=[{"role": "user", "content": "Tell a long story."}])
        other = threading.Thread(target=load_other)
        after = 0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.monotonic())
                if len(stamps) == 20:
                    other.start()
                after += "end" in loaded
                if after >= 20:
                    stream.close()  # enough: the stream went on past the load
                    break
        assert after >= 20, "the stream ended before the other model had loaded"
        other.join(120)
        assert states(server)[OTHERS[1]] == "loaded"
        lines = loaded["lines"]
        first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
        assert first_data > 0 and all(line.startswith(f": loading {OTHERS[1]}: ") for line in lines[:first_data])
        assert streamed_text(lines) == alone(OTHERS[1], ["hello"])[0]
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        during = [b - a for a, b in zip(stamps, stamps[1:]) if b >= loaded["start"] and a <= loaded["end"]]
        record_property("longest_pause_while_loading_s", round(max(during or [0.0]), 3))
        record_property("median_gap_s", round(sorted(gaps)[len(gaps) // 2], 4))
        print(f"longest pause while the other model loaded: {max(during or [0.0]):.3f} s "
              f"(median gap {sorted(gaps)[len(gaps) // 2]:.4f} s)")
