"""OpenAI's embeddings route on a real `jupyter mlx` server, driven by the unmodified openai SDK:
float and base64 vectors equal to the embedder's own (in-process, the same weights), every input
form OpenAI documents, usage counted, the embedder listed in `models` with its kind; bad requests
are 400s that say what to change, and the server goes on serving. The Client's `embed` gives the
same rows against the server as in-process."""

import base64

import numpy as np
import openai
import pytest
from live_server import serving

from mlx_nb import Client
from mlx_nb.client.embeddings import shared_embedder

TEXTS = ["A notebook embeds its corpus.", "Search finds the nearest vectors.", "The cat sat on the mat.",
         "Batching shares one forward among many requests."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings")
    flags = ("--MLXExtension.load_on_start=False", f"--MLXExtension.jobs_dir={root / 'jobs'}")
    with serving(root, "tiny-llama", *flags) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0)


@pytest.fixture(scope="module")
def local():
    return shared_embedder().embed(TEXTS).vectors


def test_the_sdk_gets_the_embedders_vectors_as_floats_and_as_base64(sdk, local):
    floats = sdk.embeddings.create(model="all-minilm-l6-v2", input=TEXTS)
    assert [d.index for d in floats.data] == list(range(len(TEXTS)))
    got = np.array([d.embedding for d in floats.data], dtype=np.float32)
    assert got.shape == (4, 384) and np.array_equal(got, local)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(
        len(shared_embedder().input_ids([t])[0]) for t in TEXTS)
    # asked for base64, the SDK hands the strings over: little-endian float32, the same numbers
    packed = sdk.embeddings.create(model="all-minilm-l6-v2", input=TEXTS, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in packed.data]
    assert np.array_equal(np.stack(decoded), local)


def test_every_input_form(sdk, local):
    one = sdk.embeddings.create(input=TEXTS[0], model="all-minilm-l6-v2").data
    assert len(one) == 1 and np.array_equal(np.float32(one[0].embedding), local[0])
    ids = [shared_embedder().tokenize(t) for t in TEXTS[:2]]
    lists = sdk.embeddings.create(input=ids, model="all-minilm-l6-v2").data
    assert np.array_equal(np.float32([d.embedding for d in lists]), local[:2])
    single = sdk.embeddings.create(input=ids[1], model="all-minilm-l6-v2").data
    assert len(single) == 1 and np.array_equal(np.float32(single[0].embedding), local[1])


def test_the_embedders_card_says_its_kind_and_state(sdk):
    card = sdk.models.retrieve("all-minilm-l6-v2").model_extra
    assert card["kind"] == "embedding"
    if card["state"] == "loaded":
        assert card["dimensions"] == 384 and card["pooling"] == "mean" and card["max_tokens"] == 256


@pytest.mark.parametrize("kwargs,status,says", [
    ({"input": "x" * 10, "dimensions": 128}, 400, "not trained to be cut"),
    ({"input": " ".join(["word"] * 300)}, 400, "reads at most 256"),
    ({"input": []}, 400, "must not be empty"),
    ({"input": [[1, 10 ** 9]]}, 400, "outside all-minilm-l6-v2's vocabulary"),
    ({"input": "hi", "model": "no-such-embedder"}, 404, "no-such-embedder"),
])
def test_bad_requests_are_400s_that_say_what_to_change(sdk, kwargs, status, says):
    kwargs.setdefault("model", "all-minilm-l6-v2")
    with pytest.raises(openai.APIStatusError) as info:
        sdk.embeddings.create(**kwargs)
    assert info.value.status_code == status and says in info.value.message
    assert len(sdk.embeddings.create(input="still serving", model="all-minilm-l6-v2").data) == 1


def test_truncate_cuts_instead_of_refusing(sdk):
    long = " ".join(["word"] * 300)
    reply = sdk.embeddings.create(input=[long], model="all-minilm-l6-v2", extra_body={"truncate": True})
    assert reply.usage.prompt_tokens == 256 and len(reply.data[0].embedding) == 384


def test_the_client_embeds_the_same_against_the_server_and_in_process(server, local):
    remote = Client(server.url, api_key=server.key).embed(TEXTS)
    embedded = Client(embedded=True).embed(TEXTS)
    assert remote.dtype == np.float32 and np.array_equal(remote, local) and np.array_equal(embedded, local)


def test_a_batch_of_embeddings_lines_runs_as_a_job(sdk, local):
    """OpenAI's Batch API takes /v1/embeddings lines: each output line is what the route answers; a
    line the route would refuse is that line's error, the others run."""
    import io
    import json
    import time

    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "all-minilm-l6-v2", "input": TEXTS[i % len(TEXTS)]}} for i in range(12)]
    lines[5]["body"]["dimensions"] = 64  # refused, as the route refuses it
    data = "\n".join(json.dumps(line) for line in lines).encode()
    upload = sdk.files.create(file=("emb.jsonl", io.BytesIO(data)), purpose="batch")
    batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.2)
        batch = sdk.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 11 and batch.request_counts.failed == 1
    out = {r["custom_id"]: r for r in map(json.loads, sdk.files.content(batch.output_file_id).text.splitlines())}
    for i in range(12):
        if i == 5:
            continue
        vector = out[f"e{i}"]["response"]["body"]["data"][0]["embedding"]
        assert np.array_equal(np.float32(vector), local[i % len(TEXTS)])
    errors = [json.loads(r) for r in sdk.files.content(batch.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["e5"] and "not trained to be cut" in json.dumps(errors[0])
