"""`jupyter mlx batch -i IN -o OUT`: a batch file run offline, resumed after a kill, malformed lines as
their own error entries, chat and completions lines side by side."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

EXE = shutil.which("jupyter-mlx", path=str(Path(sys.executable).parent))


def line(i: int, url: str = "/v1/chat/completions", max_tokens: int = 16) -> str:
    if url.endswith("chat/completions"):
        body = {"messages": [{"role": "user", "content": f"Row {i} about {i * 3}"}]}
    else:
        body = {"prompt": f"Row {i}: once upon a time"}
    body.update(max_tokens=max_tokens, temperature=0)
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body})


def run(args, home: Path, **kwargs):
    env = {**os.environ, "MLX_NB_HOME": str(home)}
    env.pop("MLX_NB_URL", None)
    return subprocess.run([EXE, "batch", *args], env=env, capture_output=True, text=True, timeout=300, **kwargs)


def test_a_batch_file_runs_offline_with_its_bad_lines_reported(tmp_path):
    lines = [line(i, "/v1/completions" if i % 3 == 0 else "/v1/chat/completions") for i in range(30)]
    lines[4] = "{not json"
    lines[9] = line(9, "/v1/moderations")
    lines[12] = json.dumps({"custom_id": "r12", "method": "POST", "url": "/v1/embeddings",
                            "body": {"input": ["an embeddings line", "beside the chats"]}})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    done = run(["-i", str(src), "-o", str(out), "--model", "tiny-llama"], tmp_path / "home")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "28 results, 2 errors" in done.stderr
    results = [json.loads(raw) for raw in out.read_text().splitlines()]
    assert len(results) == 30
    good = [r for r in results if r["error"] is None]
    assert sorted(r["custom_id"] for r in good) == sorted(f"r{i}" for i in range(30) if i not in (4, 9))
    kinds = {r["response"]["body"]["object"] for r in good}
    assert kinds == {"chat.completion", "text_completion", "list"}
    (vectors,) = [r["response"]["body"]["data"] for r in good if r["custom_id"] == "r12"]
    assert [len(v["embedding"]) for v in vectors] == [384, 384]
    bad = [r for r in results if r["error"] is not None]
    assert [r["error"]["code"] for r in bad] == ["invalid_json", "invalid_url"]


def test_a_killed_batch_run_resumes_every_row_once(tmp_path):
    src, out, home = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "home"
    src.write_text("\n".join(line(i, max_tokens=24) for i in range(60)) + "\n")
    env = {**os.environ, "MLX_NB_HOME": str(home)}
    env.pop("MLX_NB_URL", None)
    first = subprocess.Popen([EXE, "batch", "-i", str(src), "-o", str(out), "--model", "tiny-llama"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    results = None
    while results is None or len(results.read_bytes().splitlines()) < 4:
        assert first.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        found = list((home / "jobs").glob("batch_*/results.jsonl"))
        results = found[0] if found else None
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert not out.exists()  # written only once every row has its result
    assert len(results.read_bytes().splitlines()) < 60
    again = run(["-i", str(src), "-o", str(out), "--model", "tiny-llama"], home)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = [json.loads(raw)["row"] for raw in results.read_bytes().splitlines()]
    assert sorted(rows) == list(range(60))  # every row, once
    assert sorted(json.loads(raw)["custom_id"] for raw in out.read_text().splitlines()) == sorted(
        f"r{i}" for i in range(60))


def test_a_missing_input_is_one_line(tmp_path):
    done = run(["-i", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")], tmp_path / "home")
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr
    dup = tmp_path / "dup.jsonl"
    dup.write_text(line(1) + "\n" + line(1) + "\n")
    done = run(["-i", str(dup), "-o", str(tmp_path / "o.jsonl")], tmp_path / "home")
    assert done.returncode == 2 and "lines 1, 2" in done.stderr
