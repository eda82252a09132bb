"""Fill-in-the-middle over the route, with the openai SDK's legacy completions (`suffix`), against
a live `jupyter mlx` serving a tiny llama with FIM tokens: the answer is mlx_lm's for the hole's
ids alone, and status names the spelling. A model without FIM tokens answers a suffix with a 400
that says what to send instead."""

import openai
import pytest
from fim_fixture import AFTER, BEFORE, by_hand, fim_model
from live_server import serving

from mlx_nb.compat.reference import reply_tokens
from mlx_nb.models import load_model


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fim")
    path = fim_model(root / "model", "qwen")
    loaded = load_model(str(path))
    want = loaded.tokenizer.decode(reply_tokens(loaded, by_hand("qwen", BEFORE, AFTER), 12))
    del loaded
    (root / "server").mkdir()
    with serving(root / "server", str(path)) as server:
        yield server, want


def test_the_sdk_fills_the_hole(fim_server):
    server, want = fim_server
    assert server.get("status")["fill_in_the_middle"] == "qwen"
    client = openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
    reply = client.completions.create(model="m", prompt=BEFORE, suffix=AFTER, max_tokens=12, temperature=0)
    assert reply.choices[0].text == want and want
    assert reply.usage.prompt_tokens == len(BEFORE.encode()) + len(AFTER.encode()) + 3


def test_a_model_without_fim_tokens_answers_400(tmp_path):
    with serving(tmp_path, "tiny-llama") as server:
        client = openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="m", prompt=BEFORE, suffix=AFTER, max_tokens=4)
        assert "no fill-in-the-middle tokens" in str(err.value) and "send the prompt alone" in str(err.value)
        assert err.value.body.get("param") == "suffix"
