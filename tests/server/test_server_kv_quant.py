"""The quantized KV cache through the server: `--MLXExtension.kv_bits` quantizes the served model's
keys and values, `model_kv_bits` sets another model's own (0: float), and concurrent chats through the
unmodified openai SDK each answer as that model alone with that cache."""

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from live_server import serving
from mlx_nb import Engine
from mlx_nb.compat.configs import write_tiny

WIDE = {"head_dim": 32, "hidden_size": 128}
MAX = 10


def _expected(path, texts: list[str], bits) -> list[str]:
    """Each chat alone on an engine of its own with that KV setting (the engine's rows equal mlx_lm's
    generate_step with its QuantizedKVCache: tests/engine/test_engine_kv_quant.py)."""
    with Engine(str(path), prefix_cache=False, kv_bits=bits, kv_group_size=32, wait=True) as engine:
        return [engine.submit(messages=[{"role": "user", "content": t}], max_tokens=MAX).result(timeout=120).text
                for t in texts]


@pytest.mark.parametrize("seed", [1, 2])
def test_kv_bits_for_the_server_and_float_for_one_model_answer_as_alone(tmp_path, seed):
    a = write_tiny("qwen3", tmp_path / "a", seed=seed, variant=WIDE)
    b = write_tiny("qwen2", tmp_path / "b", seed=seed, variant=WIDE)
    texts = [f"{seed} {i} " + " ".join(str((i * 7 + j) % 50) for j in range(3 + 4 * i)) for i in range(6)]
    want = {"a": _expected(a, texts, 4), "b": _expected(b, texts, None)}
    assert want["a"] != _expected(a, texts, None), "4-bit keys change nothing: the test could not tell"
    (tmp_path / "server").mkdir()
    with serving(tmp_path / "server", str(a), f"--MLXExtension.models=b={b}", "--MLXExtension.kv_bits=4",
                 "--MLXExtension.kv_group_size=32", "--MLXExtension.model_kv_bits=b=0") as server:
        client = openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0, timeout=300)

        def ask(job):
            model, text = job
            r = client.chat.completions.create(model=model, max_tokens=MAX, temperature=0,
                                               messages=[{"role": "user", "content": text}])
            return r.choices[0].message.content

        jobs = [(m, t) for t in texts for m in (str(a), "b")]
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(ask, jobs))
        status = server.get("status")
    for (model, text), reply in zip(jobs, got):
        assert reply == want["a" if model == str(a) else "b"][texts.index(text)], (model, text)
    assert status["kv_cache"] == {"bits": 4, "group_size": 32} and status["peak_batch_size"] > 1


def test_a_wrong_kv_setting_stops_the_server_with_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    jupyter = str(Path(sys.executable).with_name("jupyter"))
    out = subprocess.run([jupyter, "mlx", "--MLXExtension.kv_bits=3", "--MLXExtension.load_on_start=False",
                          "--ServerApp.port=0"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "MLXExtension.kv_bits: kv_bits must be one of (4, 8)" in out.stderr


def test_a_draft_model_named_for_the_served_model_answers_as_alone_and_status_shows_it(tmp_path):
    """`--MLXExtension.draft_models=SOURCE=DRAFT`: the model speculates with that draft (here its own
    weights, so every guess is kept) and answers concurrent chats through the openai SDK as it does
    alone without speculation; the status says which draft and how many guesses were kept."""
    a = write_tiny("qwen3", tmp_path / "a", seed=3)
    texts = [" ".join(str((i * 5 + j) % 40) for j in range(2 + 3 * i)) for i in range(4)]
    with Engine(str(a), prefix_cache=False, speculation=False, wait=True) as engine:
        want = [engine.submit(messages=[{"role": "user", "content": t}], max_tokens=48).result(timeout=120).text
                for t in texts]
    (tmp_path / "server").mkdir()
    with serving(tmp_path / "server", str(a), f"--MLXExtension.draft_models={a}={a}") as server:
        client = openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0, timeout=300)

        def ask(text):
            r = client.chat.completions.create(model=str(a), max_tokens=48, temperature=0,
                                               messages=[{"role": "user", "content": text}])
            return r.choices[0].message.content

        got = [ask(texts[0])]  # alone, then the rest at once
        with ThreadPoolExecutor(len(texts)) as pool:
            got += list(pool.map(ask, texts[1:]))
        spec = server.get("status")["speculation"]
    assert got == want
    assert spec["method"] == "draft model" and spec["draft_model"] == str(a)
    drafted = spec["by_source"]["draft"]  # the draft is the model itself: every guess of its own kept
    assert drafted["accepted_tokens"] == drafted["proposed_tokens"] > 0, spec
