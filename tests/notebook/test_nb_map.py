"""`Client.map`: a model over a table as a job, embedded (no server) and against a real server.

Results come back aligned with the rows (a list, or DataFrame columns from a schema), a bad row is an
error in its row, and a map whose process is killed resumes when asked for again: every row exactly
once, the greedy answers those of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from pydantic import BaseModel

from ipython_shell import run_cell

import mlx_nb.client.jobs as client_jobs
from mlx_nb import Client, Engine

MODEL = "tiny-llama"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


class Verdict(BaseModel):
    ok: bool


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A data home of the test's own, and no job manager left from another test."""
    monkeypatch.setenv("MLX_NB_HOME", str(tmp_path))
    client_jobs._MANAGERS.clear()
    yield tmp_path
    client_jobs._MANAGERS.clear()


@pytest.fixture(scope="module")
def engine():
    with Engine(MODEL, max_batch=8, wait=True) as eng:
        yield eng


def test_map_over_strings_with_a_pydantic_schema(home, engine):
    client = Client(engine=engine)
    result = client.map([f"item {i}" for i in range(12)], "Is {text} fine?", schema=Verdict, max_tokens=16,
                        progress=False)
    assert len(result) == 12 and not result.errors
    assert all(isinstance(r, Verdict) for r in result)
    assert result.usage["completion_tokens"] > 0 and result.job_id
    # the rows ran in the background lane
    assert engine.status()["background"]["rows_done"] >= 12


def test_map_over_a_dataframe_adds_the_schema_columns_and_row_errors(home, engine):
    client = Client(engine=engine)
    frame = pd.DataFrame({"text": ["a", "b", "x " * 5000, "d"], "n": [1, 2, 3, 4]})
    out = client.map(frame, "Row {n}: is {text} fine?", schema=SCHEMA, max_tokens=16, progress=False)
    assert list(out.columns) == ["text", "n", "ok", "error", "prompt_tokens", "completion_tokens"]
    assert out["text"].tolist() == frame["text"].tolist()  # aligned with the input rows
    assert out["error"].isna().tolist() == [True, True, False, True]
    assert "maximum context length" in out["error"][2]
    assert all(isinstance(v, bool) for v in out["ok"][[0, 1, 3]])


def test_an_answer_cut_short_of_its_schema_is_that_rows_error(home, engine):
    client = Client(engine=engine)
    long_schema = {"type": "object", "properties": {"name": {"type": "string", "minLength": 40}}, "required": ["name"]}
    result = client.map(["one", "two"], "Name {text}", schema=long_schema, max_tokens=5, progress=False)
    assert result == [None, None]
    assert all("raise max_tokens" in e for e in result.errors.values())


def test_a_template_naming_a_missing_field_fails_before_anything_runs(home, engine):
    client = Client(engine=engine)
    with pytest.raises(ValueError, match="no field 'title'"):
        client.map([{"text": "a"}], "Summarize {title}", progress=False)
    assert client.jobs() == []


def test_map_again_finds_the_finished_job(home, engine):
    client = Client(engine=engine)
    first = client.map(["p", "q", "r"], "Say {text}", max_tokens=4, progress=False)
    again = client.map(["p", "q", "r"], "Say {text}", max_tokens=4, progress=False)
    assert again == first and again.job_id == first.job_id
    assert len(client.jobs()) == 1
    job = client.job(first.job_id, inputs=["p", "q", "r"])
    assert job.status()["status"] == "completed" and job.result() == first


SCRIPT = textwrap.dedent("""
    import sys
    from mlx_nb import Client
    rows = [f"row {i} about the number {i * 11}" for i in range(int(sys.argv[1]))]
    result = Client(embedded=True, model="tiny-llama").map(rows, "Tell me about {text}", max_tokens=24,
                                                           progress=False)
    print("DONE", len(result), len(result.errors), flush=True)
""")


def test_a_killed_kernels_map_resumes_every_row_once(tmp_path):
    """A process running a map is SIGKILLed (a kernel restart); the same map asked for again runs only
    the rows it had not finished, and the answers equal an uninterrupted run's."""
    script = tmp_path / "map.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MLX_NB_HOME": str(tmp_path / "home"), "MLX_NB_URL": ""}
    env.pop("MLX_NB_URL")
    first = subprocess.Popen([sys.executable, str(script), "80"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    results = None
    while results is None or len(results.read_bytes().splitlines()) < 5:
        assert first.poll() is None, "the map finished before it could be killed"
        assert time.monotonic() < deadline
        found = list((tmp_path / "home" / "jobs").glob("batch_*/results.jsonl"))
        results = found[0] if found else None
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    kept = len(results.read_bytes().splitlines())
    assert kept < 80
    second = subprocess.run([sys.executable, str(script), "80"], env=env, capture_output=True, text=True, timeout=300)
    assert "DONE 80 0" in second.stdout, second.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_bytes().splitlines()]
    assert sorted(r["row"] for r in rows) == list(range(80))  # every row exactly once
    # the same rows uninterrupted, in a fresh home
    clean_env = {**env, "MLX_NB_HOME": str(tmp_path / "clean")}
    subprocess.run([sys.executable, str(script), "80"], env=clean_env, capture_output=True, timeout=300, check=True)
    (clean,) = (tmp_path / "clean" / "jobs").glob("batch_*/results.jsonl")
    text = {}
    for line in clean.read_bytes().splitlines():
        row = json.loads(line)
        text[row["row"]] = row["response"]["body"]["choices"][0]["message"]["content"]
    for row in rows:
        assert row["response"]["body"]["choices"][0]["message"]["content"] == text[row["row"]]


@pytest.fixture
def ip(home, tmp_path_factory):
    from IPython.utils.capture import capture_output
    from ipython_shell import mlx_shell

    shell = mlx_shell(tmp_path_factory.mktemp("ipython"))
    with capture_output():
        shell.run_line_magic("mlx", "load tiny-llama")
    return shell


def test_the_map_cell_magic_fills_a_variable_and_jobs_lists_it(ip):
    ip.user_ns["frame"] = pd.DataFrame({"text": ["red", "green", "blue"], "k": [1, 2, 3]})
    ip.user_ns["Verdict"] = Verdict
    value, cap = run_cell(ip, "%%mlx map frame --out verdicts --json-schema Verdict -n 16\nIs {text} ({k}) fine?")
    assert value is None and "3 rows -> verdicts (0 with an error)" in cap.stdout, cap.stderr
    out = ip.user_ns["verdicts"]
    assert list(out["ok"].map(type)) == [bool, bool, bool] and out["text"].tolist() == ["red", "green", "blue"]
    value, cap = run_cell(ip, "%%mlx map frame -n 4\nSay {text}")
    assert value is not None and list(value.columns)[:3] == ["text", "k", "answer"]
    _, cap = run_cell(ip, "%mlx jobs")
    assert cap.stdout.count("completed") == 2 and "3/3 rows" in cap.stdout
    _, cap = run_cell(ip, "%%mlx map nowhere\nSay {text}")
    assert cap.stderr.strip() == "mlx: no variable 'nowhere' in this notebook: give the name of the table to map over"
    _, cap = run_cell(ip, "%%mlx map frame\nSay {missing}")
    assert "no field 'missing'" in cap.stderr and "Traceback" not in cap.stderr
    _, cap = run_cell(ip, "%mlx help")
    assert "%mlx map" in cap.stdout and "mlx jobs" in cap.stdout


def test_progress_outside_jupyter_is_a_bar_and_a_callable_hears_every_update(home, engine, capsys):
    client = Client(engine=engine)
    seen = []
    client.map(["a", "b", "c", "d"], "Say {text}", max_tokens=4, progress=seen.append)
    assert seen[-1]["status"] == "completed" and seen[-1]["done"] == 4 and seen[-1]["total"] == 4
    client.map(["e", "f"], "Say {text}", max_tokens=4)
    assert "2/2" in capsys.readouterr().err  # tqdm's bar on stderr


def test_the_job_picture_escapes_what_it_shows():
    from mlx_nb.pictures.job import job_svg, summary

    p = {"total": 10, "done": 4, "errors": 1, "tokens_per_s": 120.0, "rows_per_s": 2.0, "eta_s": 3.0,
         "timeline": [(0.0, 0, 0), (1.0, 2, 50), (2.0, 4, 120)]}
    svg = job_svg(p, "in_progress", "job <script>alert(1)</script>")
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "4/10 rows · 1 errors · 120 tok/s · 2.0 rows/s · ETA 3 s · in_progress" == summary(p, "in_progress")
    assert "<polyline" in svg


def test_a_job_whose_model_cannot_load_fails_with_the_reason_and_keeps_its_inputs(home):
    from mlx_nb.client import ClientError

    client = Client(embedded=True)
    with pytest.raises(ClientError, match="cannot be loaded"):
        client.map(["a", "b"], "Say {text}", model="no-such-model-anywhere", max_tokens=4, progress=False)
    (job,) = client.jobs()
    assert job["status"] == "failed" and job["errors"]["data"][0]["code"] == "model_load_failed"
    (inputs,) = home.glob("jobs/batch_*/input.jsonl")
    assert len(inputs.read_text().splitlines()) == 2


def test_a_closed_shared_engine_is_not_handed_out_again(home):
    from mlx_nb.client.backends import shared_engine

    first = shared_engine("tiny-llama")
    first.close()
    second = shared_engine("tiny-llama")
    assert second is not first and not second.closed
    assert Client(embedded=True, model="tiny-llama").chat("hi", max_tokens=2).finish_reason in ("stop", "length")


def test_a_cancel_reaches_a_job_another_process_runs(home, engine):
    """The job's lock is held elsewhere (as by another process): cancel leaves a marker, the job shows
    as cancelling, and the runner that takes it up ends it cancelled without running its rows."""
    from mlx_nb.client.jobs import embedded_manager
    from mlx_nb.jobs.manager import JobLock
    from mlx_nb.jobs.tables import map_rows

    manager = embedded_manager(engine)
    job_id = manager.create_rows("map", "/v1/chat/completions", map_rows(["a", "b", "c"], "Say {text}",
                                                                           model=None, max_tokens=4))
    elsewhere = JobLock(manager.store.job(job_id))
    assert elsewhere.acquire()
    try:
        assert not manager.start(job_id)  # held: not run here
        assert manager.cancel(job_id)["status"] == "cancelling"
    finally:
        elsewhere.release()
    assert manager.start(job_id)
    ended = manager.wait(job_id, timeout=60)
    assert ended["status"] == "cancelled" and ended["request_counts"]["completed"] == 0
