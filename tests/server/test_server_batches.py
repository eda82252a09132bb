"""OpenAI's Files and Batches APIs on a real `jupyter mlx` server, driven by the unmodified openai SDK:
upload, create, poll, download the output and error files, cancel; malformed lines become error
lines and the rest runs; duplicate custom_ids and oversized files are refused with what to change;
a server killed mid-batch resumes it at its next start, every row exactly once, greedy answers equal
to an uninterrupted run's."""

import json
import os
import signal
import time

import httpx
import openai
import pytest
from live_server import serving

MODEL = "tiny-llama"


def request_line(i: int, max_tokens: int = 6) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Row {i}: say something about {i * 7}"}],
            "max_tokens": max_tokens, "temperature": 0}
    return json.dumps({"custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0)


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.2)


def lines_of(client: openai.OpenAI, file_id) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(raw) for raw in client.files.content(file_id).text.splitlines() if raw.strip()]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("batches")
    with serving(root, MODEL, f"--MLXExtension.jobs_dir={root / 'jobs'}", "--MLXExtension.max_file_bytes=200000") as s:
        yield s


def test_sdk_runs_a_batch_with_three_malformed_lines_among_200(server):
    client = sdk(server)
    lines = [request_line(i) for i in range(200)]
    lines[17] = '{"custom_id": "row-17", "method": "POST", "url": "/v1/chat/comp'  # cut short: not JSON
    lines[88] = lines[88].replace("/v1/chat/completions", "/v1/images/generations")  # an endpoint batches don't run
    lines[150] = json.dumps({"custom_id": "row-150", "method": "POST", "url": "/v1/chat/completions"})  # no body
    upload = client.files.create(file=("requests.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes > 0
    assert client.files.retrieve(upload.id).filename == "requests.jsonl"
    assert upload.id in [f.id for f in client.files.list()]

    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"purpose": "test"})
    assert batch.object == "batch" and batch.metadata == {"purpose": "test"}
    done = wait_done(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (200, 197, 3)

    output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"row-{i}" for i in range(200) if i not in (17, 88, 150))
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] > 0
    by_id = {line["custom_id"]: line["error"] for line in errors}
    assert len(errors) == 3 and by_id.keys() == {None, "row-88", "row-150"}
    assert "line 18" in by_id[None]["message"] and "not JSON" in by_id[None]["message"]
    assert "/v1/images/generations" in by_id["row-88"]["message"]
    assert "body" in by_id["row-150"]["message"]
    assert batch.id in [b.id for b in client.batches.list()]

    # the input file can go; the batch and its output stay
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)
    assert client.batches.retrieve(batch.id).status == "completed"


def test_duplicate_custom_ids_are_refused_with_their_line_numbers(server):
    client = sdk(server)
    data = "\n".join([request_line(0), request_line(1), request_line(0), request_line(1)]).encode()
    upload = client.files.create(file=("dup.jsonl", data), purpose="batch")
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    message = err.value.body["message"] if isinstance(err.value.body, dict) else str(err.value)
    assert "'row-0' on lines 1, 3" in message and "'row-1' on lines 2, 4" in message


def test_bad_requests_get_a_clear_4xx(server):
    client = sdk(server)
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.jsonl", b"x" * 300_000), purpose="batch")
    assert err.value.status_code == 413 and "200000" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file_missing", endpoint="/v1/chat/completions", completion_window="24h")
    upload = client.files.create(file=("one.jsonl", request_line(0).encode()), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    r = server.http.post(f"{server.url}/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "nonsense"})
    assert r.status_code == 400 and "purpose" in r.json()["error"]["message"]


def test_cancel_stops_a_running_batch(server):
    client = sdk(server)
    data = "\n".join(request_line(i, max_tokens=200) for i in range(300)).encode()
    upload = client.files.create(file=("long.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_done(client, batch.id)
    assert done.status == "cancelled" and done.request_counts.completed < 300
    r = server.http.post(f"{server.url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "max_tokens": 4})
    assert r.status_code == 200


def test_a_batch_survives_sigkill_and_resumes_every_row_once(tmp_path):
    jobs = tmp_path / "jobs"
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    # four short rows finish long before the rest, so the kill lands mid-batch however slow the machine is
    data = ("\n".join(request_line(i, max_tokens=2 if i < 4 else 160) for i in range(64)) + "\n").encode()
    with serving(tmp_path / "first", MODEL, f"--MLXExtension.jobs_dir={jobs}") as first:
        client = sdk(first)
        upload = client.files.create(file=("kill.jsonl", data), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        deadline = time.monotonic() + 120
        while client.batches.retrieve(batch.id).request_counts.completed < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
    (kept,) = (jobs / "jobs").glob("batch_*/results.jsonl")
    assert 4 <= len(kept.read_bytes().splitlines()) < 64  # killed mid-batch, its finished rows on disk
    with serving(tmp_path / "second", MODEL, f"--MLXExtension.jobs_dir={jobs}") as second:
        client = sdk(second)
        resumed = wait_done(client, batch.id)
        assert resumed.status == "completed" and resumed.request_counts.completed == 64
        output = lines_of(client, resumed.output_file_id)
        ids = [line["custom_id"] for line in output]
        assert sorted(ids) == sorted(f"row-{i}" for i in range(64))  # every row, each exactly once
        # the same file, uninterrupted, on the same server: the same greedy answers
        again = client.files.create(file=("again.jsonl", data), purpose="batch")
        clean = wait_done(client, client.batches.create(input_file_id=again.id, endpoint="/v1/chat/completions",
                                                         completion_window="24h").id)
        text = {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
                for line in lines_of(client, clean.output_file_id)}
        for line in output:
            assert line["response"]["body"]["choices"][0]["message"]["content"] == text[line["custom_id"]]


def test_routes_need_the_key(server):
    with httpx.Client(trust_env=False) as anon:
        assert anon.get(f"{server.url}/batches").status_code == 401
        assert anon.get(f"{server.url}/files").status_code == 401


def test_metrics_count_the_job_rows(server):
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict:
        text = server.http.get(f"{server.url}/metrics").text
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    before = scrape()
    client = sdk(server)
    upload = client.files.create(file=("m.jsonl", "\n".join(request_line(i) for i in range(12)).encode()),
                                 purpose="batch")
    done = wait_done(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                   completion_window="24h").id)
    assert done.request_counts.completed == 12
    after = scrape()
    assert after["mlx_job_rows_total"] - before.get("mlx_job_rows_total", 0) == 12
    assert after["mlx_job_rows_waiting"] == 0 and after["mlx_job_rows_in_batch"] == 0


def test_client_map_runs_in_the_server_and_another_client_finds_the_job(server):
    import pandas as pd

    from mlx_nb import Client

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    frame = pd.DataFrame({"text": ["a", "b", "c", "d", "e"]})
    client = Client(server.url, api_key=server.key)
    out = client.map(frame, "Is {text} fine?", schema=schema, max_tokens=16, progress=False)
    assert out["error"].isna().all() and out["ok"].map(type).tolist() == [bool] * 5
    (job,) = [j for j in client.jobs() if (j.get("metadata") or {}).get("mlx_kind") == "map"]
    assert job["request_counts"]["completed"] == 5
    # another notebook (another Client) opens it by id; the same map asked again finds it
    other = Client(server.url, api_key=server.key)
    again = other.job(job["id"], inputs=frame, schema=schema).result()
    assert again["ok"].tolist() == out["ok"].tolist()
    assert other.map(frame, "Is {text} fine?", schema=schema, max_tokens=16, progress=False)["ok"].tolist() == \
        out["ok"].tolist()
    assert len([j for j in other.jobs() if (j.get("metadata") or {}).get("mlx_kind") == "map"]) == 1


def test_a_server_fronting_a_backend_runs_its_jobs_there(server, tmp_path):
    from mlx_nb import Client

    (tmp_path / "front").mkdir()
    with serving(tmp_path / "front", MODEL, f"--MLXExtension.backend_url={server.url}",
                 f"--MLXExtension.backend_api_key={server.key}", f"--MLXExtension.jobs_dir={tmp_path / 'jobs'}") as front:
        before = server.get("status")["generated_tokens"]
        result = Client(front.url, api_key=front.key).map(["x", "y", "z"], "Say {text}", max_tokens=6,
                                                         progress=False)
        assert len(result) == 3 and not result.errors and all(isinstance(r, str) for r in result)
        assert server.get("status")["generated_tokens"] > before  # the backend did the work


def test_batch_lines_naming_an_adapter_decode_with_it(tmp_path):
    from lora_fixture import make_adapter

    from mlx_nb.models.sources import resolve

    folder = make_adapter(resolve(MODEL), tmp_path / "terse", seed=7, rank=4)
    (tmp_path / "srv").mkdir()
    with serving(tmp_path / "srv", MODEL, f"--MLXExtension.adapters=terse={folder}",
                 f"--MLXExtension.jobs_dir={tmp_path / 'jobs'}") as server:
        client = sdk(server)
        names = [MODEL, f"{MODEL}@terse", f"{MODEL}@nope"]
        lines = []
        for i in range(9):
            line = json.loads(request_line(i, max_tokens=12))
            line["body"]["model"] = names[i % 3]
            lines.append(json.dumps(line))
        upload = client.files.create(file=("adapters.jsonl", "\n".join(lines).encode()), purpose="batch")
        done = wait_done(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                        completion_window="24h").id)
        assert (done.request_counts.completed, done.request_counts.failed) == (6, 3)
        errors = lines_of(client, done.error_file_id)
        assert all("no adapter 'nope'" in e["error"]["message"] for e in errors)
        for line in lines_of(client, done.output_file_id):
            i = int(line["custom_id"].split("-")[1])
            body = json.loads(lines[i])["body"]
            live = client.chat.completions.create(**body)  # the same request, interactive
            assert line["response"]["body"]["choices"][0]["message"]["content"] == live.choices[0].message.content
        # and the adapter made a difference: the base model answers those rows otherwise
        differs = []
        for line in lines_of(client, done.output_file_id):
            body = json.loads(lines[int(line["custom_id"].split("-")[1])])["body"]
            if body["model"].endswith("@terse"):
                base = client.chat.completions.create(**{**body, "model": MODEL}).choices[0].message.content
                differs.append(base != line["response"]["body"]["choices"][0]["message"]["content"])
        assert len(differs) == 3 and any(differs)
