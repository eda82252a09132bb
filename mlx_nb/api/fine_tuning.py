"""OpenAI's fine-tuning jobs route (`/v1/fine_tuning/jobs`) over mlx_nb/training: each route's
whole work, free of the web framework.

A job is created from an uploaded JSONL file (`/v1/files`, purpose "fine-tune", in any of mlx_lm's
row shapes: chat, prompt/completion, text) and the base `model`; `suffix` names the adapter (it is
served as `model@suffix`). OpenAI's `hyperparameters` are read as they are meant: `n_epochs` (steps
= epochs x rows / batch), `batch_size`, `learning_rate_multiplier` (times 2e-4, mlx-nb's default
rate); this server's own settings (rank, num_layers, iters, learning_rate, steps_per_save, ...)
may be given under `settings`. The job object carries OpenAI's fields (status queued, running,
succeeded, failed, cancelled; `fine_tuned_model` once done) and this server's progress: step,
losses, tokens/s, ETA, and the adapters served so far.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from mlx_nb.api.errors import APIError, invalid_request, not_found

STATUS = {"queued": "queued", "running": "running", "completed": "succeeded", "failed": "failed",
          "cancelled": "cancelled", "cancelling": "running"}


def _missing(job_id: str) -> APIError:
    return not_found(f"no fine-tuning job {job_id!r}: GET /v1/fine_tuning/jobs lists them")


def _rows(store, file_id: Any, field: str) -> Optional[list]:
    if file_id is None:
        return None
    if not isinstance(file_id, str) or not file_id:
        raise invalid_request(f"{field} must be the id of a file uploaded with purpose 'fine-tune'", field)
    try:
        data = store.file_path(file_id).read_bytes()
    except (KeyError, OSError):
        raise not_found(f"no file {file_id!r}: upload the JSONL to /v1/files (purpose 'fine-tune') first") from None
    rows = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise invalid_request(f"{field} line {number} is not JSON: fix or remove it", field) from None
    return rows


def _settings(req: dict) -> dict:
    settings = req.get("settings") or {}
    if not isinstance(settings, dict):
        raise invalid_request("settings must be an object of mlx-nb training settings", "settings")
    hyper = req.get("hyperparameters") or ((req.get("method") or {}).get("supervised") or {}).get("hyperparameters")
    hyper = {k: v for k, v in (hyper or {}).items() if v not in (None, "auto")}
    out = dict(settings)
    if "batch_size" in hyper:
        out.setdefault("batch_size", int(hyper["batch_size"]))
    if "learning_rate_multiplier" in hyper:
        out.setdefault("learning_rate", 2e-4 * float(hyper["learning_rate_multiplier"]))
    if "n_epochs" in hyper:
        out["_epochs"] = int(hyper["n_epochs"])
    return out


def create_job(manager, store, body: bytes) -> dict:
    from mlx_nb.training.manager import TrainingError

    try:
        req = json.loads(body or b"{}")
    except ValueError:
        raise invalid_request("the body is not JSON: send a JSON object") from None
    if not isinstance(req, dict):
        raise invalid_request("the body must be a JSON object")
    model, name = req.get("model"), req.get("suffix")
    if not isinstance(model, str) or not model:
        raise invalid_request("model is required: the base model to fine-tune", "model")
    if not isinstance(name, str) or not name:
        raise invalid_request("suffix is required: the adapter's name (it is served as model@suffix)", "suffix")
    train = _rows(store, req.get("training_file"), "training_file")
    if train is None:
        raise invalid_request("training_file is required: upload the JSONL with purpose 'fine-tune' first",
                              "training_file")
    val = _rows(store, req.get("validation_file"), "validation_file")
    settings = _settings(req)
    epochs = settings.pop("_epochs", None)
    if epochs is not None and "iters" not in settings:
        settings["iters"] = max(1, epochs * len(train) // int(settings.get("batch_size", 4)))
    if req.get("seed") is not None:
        settings.setdefault("seed", int(req["seed"]))
    try:
        job_id = manager.create(train, model, name, val=val, **settings)
    except TrainingError as exc:
        raise invalid_request(str(exc)) from None
    out = retrieve_job(manager, job_id)
    out["training_file"], out["validation_file"] = req.get("training_file"), req.get("validation_file")
    return out


def retrieve_job(manager, job_id: str) -> dict:
    try:
        info = manager.describe(job_id)
    except KeyError:
        raise _missing(job_id) from None
    s = info["settings"]
    done = info["status"] == "completed"
    return {**info, "object": "fine_tuning.job", "model": s["base"], "created_at": int(info["created_at"]),
            "finished_at": int(info["ended_at"]) if info.get("ended_at") else None,
            "status": STATUS.get(info["status"], info["status"]), "fine_tuned_model": f"{s['base']}@{s['name']}"
            if done else None, "hyperparameters": {"n_epochs": "auto", "batch_size": s["batch_size"],
                                                    "learning_rate_multiplier": s["learning_rate"] / 2e-4},
            "seed": s["seed"], "trained_tokens": info.get("trained_tokens"), "result_files": [],
            "error": {"message": info["error"], "code": "training_failed", "param": None}
            if info.get("error") else None, "organization_id": "local", "mlx_status": info["status"]}


def list_jobs(manager, limit: Any = None, after: Optional[str] = None) -> dict:
    jobs = [retrieve_job(manager, j["id"]) for j in manager.list()]
    ids = [j["id"] for j in jobs]
    if after in ids:
        jobs = jobs[ids.index(after) + 1:]
    n = 20 if limit is None else int(limit)
    return {"object": "list", "data": jobs[:n], "has_more": len(jobs) > n}


def cancel_job(manager, job_id: str) -> dict:
    try:
        manager.cancel(job_id)
    except KeyError:
        raise _missing(job_id) from None
    return retrieve_job(manager, job_id)


def job_events(manager, job_id: str) -> dict:
    """The losses as OpenAI's fine-tuning events (type "metrics", newest first)."""
    try:
        events = manager.events(job_id)
    except KeyError:
        raise _missing(job_id) from None
    data = [{"object": "fine_tuning.job.event", "id": f"{job_id}-{i}", "created_at": int(e["time"]), "level": "info",
             "type": "metrics", "message": f"{e['kind']} step {e['step']}", "data": e}
            for i, e in enumerate(events)]
    return {"object": "list", "data": data[::-1], "has_more": False}


def job_checkpoints(manager, job_id: str) -> dict:
    try:
        record = manager.describe(job_id)
        served = manager.served(job_id)
    except KeyError:
        raise _missing(job_id) from None
    base = record["settings"]["base"]
    data = [{"object": "fine_tuning.job.checkpoint", "id": name, "fine_tuned_model_checkpoint": f"{base}@{name}",
             "step_number": int(name.rsplit("-", 1)[1]) if ":step-" in name else record["total_steps"],
             "fine_tuning_job_id": job_id, "folder": folder} for name, folder in served.items()]
    return {"object": "list", "data": data[::-1], "has_more": False}
