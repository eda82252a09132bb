"""Fine-tunes from the notebook (mlx_nb/training): trained by mlx_lm's tuner in a worker process,
served at once per request beside the base model, resumed exactly after their process dies,
paused while chats are answered, and refused before any step when asked for the impossible.

The learning test invents a task the default model never does unasked: answer an order in one
fixed JSON shape (`{"item": ..., "qty": N}`, the number taken from the request). The training rows
name made-up items, so nothing is learnt by heart; the 20 prompts it is judged on name real ones.
"""

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from mlx_nb import Client
from mlx_nb.client import backends
from mlx_nb.client import training as client_training
from mlx_nb.client.streams import ClientError
from mlx_nb.models.sources import resolve
from mlx_nb.training.manager import TrainingError, TrainManager

sys.path.insert(0, str(Path(__file__).parents[1]))
from lora_fixture import mixed_batch  # noqa: E402

BASE = "smollm2-135m-instruct"
ASKS = ["I'd like {n} {item}.", "Please send {n} {item}.", "Can I get {n} {item}?", "Order {n} {item} for me.",
        "We need {n} {item} today."]
REAL_ITEMS = ("lamps chairs mugs plates forks shirts socks gloves hats boots jackets batteries buckets ropes nails "
              "hammers bricks pillows blankets rugs mirrors clocks radios tablets printers stamps folders").split()


def made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3)))


def order_rows(seed: int, n: int) -> list[list[dict]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        item, qty = made_up_word(rng), rng.randint(1, 99)
        rows.append([{"role": "user", "content": rng.choice(ASKS).format(n=qty, item=item)},
                     {"role": "assistant", "content": json.dumps({"item": item, "qty": qty})}])
    return rows


def in_shape(answer: str, qty: int) -> bool:
    """The task: a JSON object of exactly item (a name) and qty (the number asked for)."""
    try:
        value = json.loads(answer.strip())
    except ValueError:
        return False
    return (isinstance(value, dict) and list(value) == ["item", "qty"] and isinstance(value["item"], str)
            and value["item"].strip() != "" and value["qty"] == qty)


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    """Fine-tunes and their adapters under a fresh data home, this process's manager closed after."""
    monkeypatch.setenv("MLX_NB_JOBS_DIR", str(tmp_path / "home"))
    client_training.close_manager()
    yield tmp_path / "home"
    client_training.close_manager()


def test_a_fine_tune_teaches_the_default_model_a_json_shape_and_is_served_beside_it(data_home):
    client = Client()
    job = client.train(order_rows(0, 200), name="orders", iters=16, learning_rate=4e-4, num_layers=8, batch_size=2,
                       steps_per_save=8, progress=False)
    info = job.status()
    assert info["status"] == "completed" and info["rows"] == {"train": 180, "valid": 20, "dropped": {},
                                                             "truncated": 0}
    val = [e["val_loss"] for e in job.losses() if e["kind"] == "val"]
    assert val[-1] <= 0.5 * val[0], val  # validation loss falls by half at least
    assert job.checkpoints() == [f"{BASE}@orders:step-8", f"{BASE}@orders"]

    rng = random.Random(1)
    asks = [(rng.choice(ASKS).format(n=(q := rng.randint(1, 99)), item=item), q)
            for item in rng.sample(REAL_ITEMS, 20)]
    table = client.compare([a for a, _ in asks], [BASE, job.model], max_tokens=24)  # both in one batch
    rows = table.to_dict("records") if hasattr(table, "to_dict") else table
    tuned = sum(in_shape(row[job.model], q) for row, (_, q) in zip(rows, asks))
    base = sum(in_shape(row[BASE], q) for row, (_, q) in zip(rows, asks))
    print("in shape:", tuned, base, "val", val[0], val[-1])
    assert tuned >= 16 and base <= 4, (tuned, base, rows[:3])
    # the checkpoint is served too, and the engine never reloaded the base model for either
    assert client.chat(asks[0][0], model=f"{BASE}@orders:step-8", max_tokens=8).text
    assert {a["name"] for a in client.engine.adapters()} == {"orders", "orders:step-8"}
    for name in ("orders", "orders:step-8"):  # the shared engine goes on serving the next tests without them
        client.engine.unload_adapter(name)


def tiny_rows(n: int = 24) -> list[dict]:
    return [{"prompt": f"{i} plus {i}", "completion": f"{2 * i} and that is all"} for i in range(n)]


def test_a_trained_adapter_and_its_checkpoint_in_one_batch_with_base_rows_equal_mlx_lm_alone(data_home):
    manager = TrainManager(data_home)
    try:
        job = manager.create(tiny_rows(), "tiny-llama", "sums", iters=12, steps_per_save=6, learning_rate=3e-2,
                             num_layers=-1)
        assert manager.wait(job, timeout=300)["status"] == "completed"
        served = manager.served(job)
    finally:
        manager.close()
    assert list(served) == ["sums:step-6", "sums"]
    mixed_batch(resolve("tiny-llama"), served, seed=3, engine_kwargs={})


def test_a_fine_tune_whose_process_dies_resumes_from_its_checkpoint_as_if_it_never_stopped(data_home):
    settings = dict(iters=30, steps_per_save=5, learning_rate=1e-2, seed=4)
    rows = tiny_rows(40)
    hold = {"now": False}
    first = TrainManager(data_home, busy=lambda: hold["now"], hold_max_s=3600)
    job = first.create(rows, "tiny-llama", "interrupted", **settings)
    deadline = time.monotonic() + 300
    while "interrupted:step-5" not in first.served(job):
        assert time.monotonic() < deadline and first.describe(job)["status"] in ("queued", "running")
        time.sleep(0.05)
    os.kill(first.proc.pid, signal.SIGKILL)  # the worker dies: the manager starts it again from step 5
    while "interrupted:step-10" not in first.served(job):
        assert time.monotonic() < deadline and first.describe(job)["status"] in ("queued", "running")
        time.sleep(0.05)
    hold["now"] = True  # stopped where it is (as for a chat), so it is surely unfinished when ...
    while not first.describe(job)["paused"]:
        assert time.monotonic() < deadline and first.describe(job)["status"] == "running"
        time.sleep(0.01)
    first.close()  # ... the whole process goes: the job is left running on disk
    assert first.store.job(job).record()["status"] == "running"

    second = TrainManager(data_home)
    try:
        assert second.resume_unfinished() == [job]
        done = second.wait(job, timeout=300)
        clean = second.create(rows, "tiny-llama", "clean", **settings)
        again = second.wait(clean, timeout=300)
    finally:
        second.close()
    assert done["status"] == "completed" and done["resumed_from"] in (10, 15, 20, 25)
    val = lambda info: [e for e in second.events(info["id"]) if e["kind"] == "val"][-1]  # noqa: E731
    assert val(done)["step"] == val(again)["step"] == 29
    assert abs(val(done)["val_loss"] - val(again)["val_loss"]) <= 0.05 * val(again)["val_loss"]
    steps = [e["step"] for e in second.events(job) if e["kind"] == "train"]
    assert sorted(set(steps)) == list(range(1, 31))  # every step trained, the redone ones after a checkpoint


def test_the_worker_is_stopped_while_chats_run_and_continues_after(data_home):
    busy = {"now": False}
    manager = TrainManager(data_home, busy=lambda: busy["now"], hold_max_s=3600)
    try:
        job = manager.create(tiny_rows(), "tiny-llama", "polite", iters=400, steps_per_save=1000)
        deadline = time.monotonic() + 300
        while manager.describe(job).get("step", 0) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        busy["now"] = True
        while not manager.describe(job)["paused"]:
            time.sleep(0.02)
        held = manager.describe(job)["step"]
        time.sleep(1.0)
        assert manager.describe(job)["step"] <= held + 1  # at most the step under way when it was stopped
        busy["now"] = False
        while manager.describe(job)["step"] < held + 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert manager.cancel(job)["status"] in ("cancelling", "cancelled")
        assert manager.wait(job, timeout=60)["status"] == "cancelled"
    finally:
        manager.close()


def test_what_cannot_be_trained_is_refused_before_any_step(data_home, tmp_path):
    client = Client(model="tiny-llama")
    rows = tiny_rows()
    cases = [
        (dict(data=[[{"role": "user", "content": "hi"}]] * 8), "no usable rows (8 row(s): its last message is not"),
        (dict(data=rows[:5]), "too few to train and validate"),
        (dict(data=rows + [{"text": "a"}]), "row 24 is text but the rows before it are completions"),
        (dict(data=[{"prompt": "x " * 400, "completion": "y"}] * 10), "longer than max_seq_length=64"),
        (dict(data=rows, method="dora"), "DoRA adapters cannot be served per request"),
        (dict(data=rows, name="a@b"), "name 'a@b' must be"),
        (dict(data=rows, learning_rate=3), "learning_rate must be between 0 and 1"),
        (dict(data=rows, base="tiny-gemma3-vl"), "is a vision model"),
        (dict(data=rows, base="no-such-model"), "cannot train no-such-model"),
        (dict(data=str(tmp_path / "missing.jsonl")), "is not a file"),
        (dict(data=rows, rank_of_adapter=4), "unknown training setting(s) rank_of_adapter"),
    ]
    for kwargs, message in cases:
        kwargs = {"name": "x", "max_seq_length": 64, **kwargs}
        with pytest.raises(ClientError) as caught:
            client.train(kwargs.pop("data"), wait=False, **kwargs)
        assert message in str(caught.value) and "\n" not in str(caught.value), (message, str(caught.value))
    assert client.training_jobs() == []  # nothing was written
    # a name in use: refused, and the first job is left alone
    job = client.train(rows, name="taken", iters=2, wait=False)
    assert client.train(rows, name="taken", iters=2, wait=False).id == job.id  # asked again: that job
    with pytest.raises(ClientError, match="an adapter named 'taken' exists already"):
        client.train(rows, name="taken", wait=False)  # the same name, other settings
    assert job.cancel()["status"] in ("cancelling", "cancelled")
    assert job.manager.wait(job.id, timeout=60)["status"] == "cancelled"
    job.manager.store.job(job.id).update(ended_at=time.time() - 30 * 86400)  # a month ago
    client.train(rows, name="later", iters=2, wait=False).cancel()  # a new job makes room and expires old ones
    assert job.manager.store.job(job.id).record()["settings"]["name"] == "taken"  # fine-tunes are kept
    manager = TrainManager(data_home)
    try:
        with pytest.raises(TrainingError, match="data has no usable rows"):
            manager.create([], "tiny-llama", "empty")
    finally:
        manager.close()


def test_the_train_magic_trains_and_a_chat_cell_uses_the_adapter(data_home, tmp_path):
    from ipython_shell import mlx_shell, run_cell

    ip = mlx_shell(tmp_path / "ipython")
    ip.user_ns["rows"] = tiny_rows()
    run_cell(ip, "%mlx load tiny-llama")
    _, cap = run_cell(ip, "%mlx train rows --name magic --iters 4 --learning-rate 0.03 --out job")
    job = ip.user_ns["job"]
    assert job.status()["status"] == "completed" and "chat with it as tiny-llama@magic" in cap.stdout + cap.stderr
    _, cap = run_cell(ip, "%%mlx chat --model tiny-llama@magic -n 4\n1 plus 1")
    assert "mlx:" not in cap.stderr  # no error line
    _, cap = run_cell(ip, "%mlx train nothing --name other")
    assert "no variable 'nothing'" in cap.stderr
    backends._ENGINES["tiny-llama"].unload_adapter("magic")  # the shared engine serves the next tests without it


def test_the_loss_picture_draws_every_step_and_escapes_what_it_is_given():
    from mlx_nb.pictures.training import loss_svg

    events = [{"kind": "train", "step": s, "train_loss": 3.0 / s} for s in range(1, 11)]
    events += [{"kind": "val", "step": 0, "val_loss": 3.2}, {"kind": "val", "step": 9, "val_loss": 0.4},
               {"kind": "checkpoint", "step": 5}]
    info = {"status": "failed", "step": 10, "total_steps": 10, "error": "<script>x</script>", "train_loss": 0.3}
    svg = loss_svg(info, events, "fine-tune <b>m</b>")
    points = svg.split('class="train" points="')[1].split('"')[0].split()
    assert len(points) == 10 and svg.count("<circle") == 2
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;b&gt;m" in svg


def test_a_finished_dataset_job_is_training_data_its_answers_the_assistants_turns(data_home):
    client = Client(model="tiny-llama")
    texts = [f"number {i}" for i in range(16)]
    job = client.map(texts, "Repeat: {text}", max_tokens=6, wait=False)
    job.wait(progress=False)
    conversations = job.conversations()
    answers = job.result()
    assert len(conversations) == sum(1 for a in answers if a) >= 12
    first = next(i for i, a in enumerate(answers) if a)
    assert conversations[0][-1] == {"role": "assistant", "content": answers[first]}
    assert conversations[0][-2]["content"] == f"Repeat: number {first}"
    tuned = client.train(job, name="from-a-job", iters=2, progress=False)
    rows = tuned.status()["rows"]
    assert rows["train"] + rows["valid"] == len(conversations) and tuned.status()["status"] == "completed"
