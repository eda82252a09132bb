"""One fine-tune, run in its own process: `python -m mlx_nb.training.worker JOB_FOLDER`.

Why a process and not a thread of the server: training holds the cores for seconds per step and
allocates gigabytes; in its own process it can be paused at once (SIGSTOP) when a chat arrives and
resumed after (the engine's process never waits for a step), given a lower priority, limited to
some cores, killed without leaving anything half-done, and it never holds the GIL the server's
event loop needs. It dies with its parent (PR_SET_DEATHSIG, set by the manager).

The loop is mlx_lm's (`mlx_lm.tuner.trainer.train`): this adds what a job needs around it.
- Every step's loss (and every validation) is appended to `events.jsonl`, fsync'd.
- Every `steps_per_save` steps a checkpoint folder `checkpoints/step-NNNNNNN/` is written whole or
  not at all (a temporary folder renamed): the adapter as mlx_lm writes it (adapter_config.json +
  adapters.safetensors, so it is served as `name:step-N` and mlx_lm loads it), the optimizer's
  state and the step. A restarted worker resumes from the last one exactly: same weights, same
  Adam moments, and the same batches next (each epoch's order is seeded by the job's seed and the
  epoch, so the batches already trained on are skipped, not redrawn).
- At the end the adapter folder `adapter/` is written the same way and the record says completed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
EVENTS = "events.jsonl"


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def last_checkpoint(folder: Path):
    """(step, path) of the newest complete checkpoint in `folder`, or (0, None)."""
    root = Path(folder) / CHECKPOINTS
    found = sorted(p for p in root.glob("step-*") if (p / "state.json").is_file()) if root.exists() else []
    if not found:
        return 0, None
    return json.loads((found[-1] / "state.json").read_text())["step"], found[-1]


def write_folder_atomically(dest: Path, fill) -> Path:
    """`dest` made by `fill(tmp)` in a temporary sibling, then renamed: it exists whole or not at all."""
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:6]}")
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as h:
                os.fsync(h.fileno())
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def trainable_model(base: str):
    """(model, tokenizer) of `base` for training: a converted GGUF's blocks dequantized to float32
    (the values the served kernels compute with, so the adapter learns against the model it will
    ride on); an MLX folder as mlx_lm loads it (quantized layers stay quantized: QLoRA as mlx_lm
    does it). A vision model is refused."""
    from mlx_lm.utils import load

    from mlx_nb.models.gguf_load import is_gguf_dir, load_gguf_dir
    from mlx_nb.models.loader import read_config
    from mlx_nb.models.sources import resolve

    path = resolve(base)
    config = read_config(path)
    if "vision_config" in config:
        raise ValueError(f"{base} is a vision model: fine-tuning trains language models only")
    if is_gguf_dir(config):
        model, tokenizer, _ = load_gguf_dir(path, config, kernels=False)
        return model, tokenizer
    return load(str(path))


def seeded_batches(seed: int, skip: int):
    """mlx_lm's `iterate_batches`, with each training epoch's order drawn from (seed, epoch) and the
    first `skip` training batches passed over: a resumed job sees the batches it had not seen yet."""
    from mlx_lm.tuner.trainer import iterate_batches

    def batches(dataset, batch_size, max_seq_length, loop=False, seed_=None, comm_group=None, **kw):
        if not loop:  # a validation pass: every batch once
            yield from iterate_batches(dataset, batch_size, max_seq_length, loop=False, comm_group=comm_group)
            return
        drawn, epoch = 0, 0
        while True:
            for batch in iterate_batches(dataset, batch_size, max_seq_length, loop=False, seed=seed + epoch,
                                         comm_group=comm_group):
                drawn += 1
                if drawn > skip:
                    yield batch
            epoch += 1

    return batches


class JobCallback:
    """mlx_lm's TrainingCallback for a job: events, checkpoints, the record."""

    def __init__(self, job, settings, model, optimizer, done: int, total: int, layers: int):
        from mlx_nb.jobs.store import ResultLog

        self.job, self.settings, self.model, self.optimizer = job, settings, model, optimizer
        self.done, self.total, self.layers = done, total, layers
        self.events = ResultLog(job.path / EVENTS)
        self.began = time.time()

    def _event(self, **values) -> None:
        self.events.append([{"time": round(time.time(), 3), **values}])

    def on_val_loss_report(self, info: dict) -> None:
        self._event(kind="val", step=self.done + info["iteration"], val_loss=float(info["val_loss"]))

    def on_train_loss_report(self, info: dict) -> None:
        step = self.done + info["iteration"]
        self._event(kind="train", step=step, train_loss=float(info["train_loss"]),
                    tokens_per_second=float(info["tokens_per_second"]), trained_tokens=int(info["trained_tokens"]),
                    learning_rate=float(info["learning_rate"]), peak_memory_gb=float(info["peak_memory"]))
        if step % self.settings.steps_per_save == 0 and step < self.total:
            self.save(Path(self.job.path) / CHECKPOINTS / checkpoint_name(step), step, optimizer=True)
            self._event(kind="checkpoint", step=step, name=f"{self.settings.name}:step-{step}")

    def save(self, dest: Path, step: int, optimizer: bool) -> Path:
        import mlx.core as mx
        from mlx.utils import tree_flatten

        def fill(tmp: Path):
            weights = dict(tree_flatten(self.model.trainable_parameters()))
            mx.save_safetensors(str(tmp / "adapters.safetensors"), weights)
            (tmp / "adapter_config.json").write_text(json.dumps(self.settings.adapter_config(self.layers), indent=1))
            if optimizer:
                mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(self.optimizer.state)))
            (tmp / "state.json").write_text(json.dumps({"step": step}))

        dest.parent.mkdir(parents=True, exist_ok=True)
        return write_folder_atomically(dest, fill)


def _restore(model, optimizer, checkpoint: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    model.load_weights(str(checkpoint / "adapters.safetensors"), strict=False)
    saved = mx.load(str(checkpoint / "optimizer.safetensors"))
    optimizer.init(model.trainable_parameters())
    optimizer.state = tree_map_with_path(lambda path, v: saved.get(path, v), optimizer.state)


def run(folder: Path) -> None:
    import mlx_nb  # noqa: F401,I001  (the fast BLAS, loaded before MLX)
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm.tuner.datasets import CacheDataset, create_dataset
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from mlx_nb.jobs.store import JobFolder
    from mlx_nb.training.settings import TrainSettings

    job = JobFolder(folder)
    record = job.record()
    settings = TrainSettings.from_dict(record["settings"])
    rows = list(job.inputs())
    train_rows = [r["row"] for r in rows if r["split"] == "train"]
    val_rows = [r["row"] for r in rows if r["split"] == "valid"]
    total = settings.steps(len(train_rows))

    mx.random.seed(settings.seed)
    model, tokenizer = trainable_model(settings.base)
    model.freeze()
    layers = len(model.layers) if settings.num_layers == -1 else min(settings.num_layers, len(model.layers))
    params = {"rank": settings.rank, "scale": settings.scale, "dropout": settings.dropout}
    if settings.keys:
        params["keys"] = list(settings.keys)
    linear_to_lora_layers(model, layers, params)
    optimizer = optim.Adam(learning_rate=settings.learning_rate)
    done, checkpoint = last_checkpoint(folder)
    if checkpoint is not None:
        _restore(model, optimizer, checkpoint)
    job.update(status="running", step=done, total_steps=total, resumed_from=done or None, pid=os.getpid(),
               blas_threads=int(os.environ.get("OPENBLAS_NUM_THREADS") or 0) or None)

    config = SimpleNamespace(mask_prompt=settings.mask_prompt and record["shape"] != "text")
    train_set = CacheDataset(create_dataset(train_rows, tokenizer, config))
    val_set = CacheDataset(create_dataset(val_rows, tokenizer, config))
    callback = JobCallback(job, settings, model, optimizer, done, total, layers)
    if done < total:
        args = TrainingArgs(batch_size=settings.batch_size, iters=total - done, val_batches=-1, steps_per_report=1,
                            steps_per_eval=settings.steps_per_save, steps_per_save=total + 1,
                            max_seq_length=settings.max_seq_length,
                            adapter_file=str(Path(folder) / ".last.safetensors"))
        train(model, optimizer, train_set, val_set, args, iterate_batches=seeded_batches(settings.seed, done),
              training_callback=callback)
        (Path(folder) / ".last.safetensors").unlink(missing_ok=True)
    callback.save(Path(folder) / ADAPTER, total, optimizer=False)
    callback.events.close()
    job.update(status="completed", step=total, ended_at=time.time())


if __name__ == "__main__":
    run(Path(sys.argv[1]))
