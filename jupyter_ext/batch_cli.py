"""`jupyter mlx batch -i requests.jsonl -o results.jsonl`: OpenAI batch input run offline, as vLLM's
`run-batch` runs it, for scripts and clusters: no server, one embedded engine per model the lines
name, the rows kept as a job under the data home. Run the same command again after an interruption
(Ctrl-C, a killed process) and it resumes: only the rows without a result run. Each line's `url`
may be /v1/chat/completions or /v1/completions; a malformed line becomes that line's error entry.
The output file holds one line per input line, in OpenAI's output format, written atomically when
every row has its result."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Optional

from jupyter_core.application import JupyterApp
from traitlets import Unicode

from jupyter_ext.settings import EngineTraits, engine_kwargs


class BatchApp(EngineTraits, JupyterApp):
    """The engine's settings are EngineConfig's (`--BatchApp.kv_bits=8`, `--max-batch 16`), as the server's."""

    name = "jupyter-mlx-batch"
    description = "Run an OpenAI batch file (JSONL) through the engine offline, resumably."
    aliases = {"i": "BatchApp.input", "input": "BatchApp.input", "o": "BatchApp.output",
               "output": "BatchApp.output", "model": "BatchApp.model", "max-batch": "BatchApp.max_batch"}

    input = Unicode("", help="The batch input file: one request a line ({custom_id, method, url, body}).").tag(
        config=True)
    output = Unicode("", help="Where the results go (one line per input line, OpenAI's output format).").tag(
        config=True)
    model = Unicode("", help="The model for lines whose body names none (default: the built-in default).").tag(
        config=True)

    def start(self):
        if not self.input or not self.output:
            self.exit_with(2, "jupyter mlx batch: give -i INPUT.jsonl and -o OUTPUT.jsonl")
        try:
            data = Path(self.input).read_bytes()
        except OSError as exc:
            self.exit_with(2, f"jupyter mlx batch: cannot read {self.input}: {exc.strerror}")
        summary = run_file(data, Path(self.output), self.model or None, engine_kwargs(self))
        print(f"jupyter mlx batch: {summary['completed']} results, {summary['failed']} errors -> {self.output}",
              file=sys.stderr)

    def exit_with(self, code: int, message: str) -> None:
        print(message, file=sys.stderr)
        self.exit(code)


def run_file(data: bytes, output: Path, model: Optional[str] = None, settings: Optional[dict] = None,
             progress: bool = True) -> dict:
    """Run (or resume) the batch in `data`, write `output`; the request counts. `settings`: the
    engines' (EngineConfig's, by name)."""
    from mlx_nb.client.embeddings import shared_embedder
    from mlx_nb.engine import Engine
    from mlx_nb.jobs.lines import BatchInputError, parse_input, public
    from mlx_nb.jobs.manager import JobManager
    from mlx_nb.jobs.rows import LocalTarget
    from mlx_nb.jobs.store import Store
    from mlx_nb.models.sources import DEFAULT_MODEL

    try:
        rows = parse_input(data, None)
    except BatchInputError as exc:
        print(f"jupyter mlx batch: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    engines: dict = {}
    making = threading.Lock()  # the job's first rows ask for their engine at once, from several threads

    def engine_for(name: Optional[str]):
        name = name or model or DEFAULT_MODEL
        with making:
            if name not in engines:
                engines[name] = Engine(name, **(settings or {}))
            return engines[name], name

    target = LocalTarget(engine_for, embedder_for=shared_embedder)
    manager = JobManager(Store(), target, source="job: jupyter mlx batch")
    # the model for lines that name none is part of what the job is: another --model is another job
    job_id = manager.create_rows(f"batch_cli:{model or DEFAULT_MODEL}", "mixed", rows, {"input_sha": _sha(data)})
    if not manager.start(job_id) and manager.describe(job_id)["status"] not in ("completed",):
        print(f"jupyter mlx batch: job {job_id} is being run by another process", file=sys.stderr)
        raise SystemExit(1)
    from mlx_nb.jobs.store import write_bytes_atomically

    try:
        job = _wait(manager, job_id, progress)
    finally:
        for engine in engines.values():
            engine.close()
    if job.get("status") != "completed":
        counts = job["request_counts"]
        print(f"jupyter mlx batch: stopped ({job.get('status')}) with {counts['completed'] + counts['failed']} of "
              f"{counts['total']} rows done; run the same command again to resume", file=sys.stderr)
        raise SystemExit(1)
    lines = manager.results(job_id)
    write_bytes_atomically(output, b"".join(json.dumps(public(line), ensure_ascii=False).encode() + b"\n"
                                            for line in lines))
    return job["request_counts"]


def _wait(manager, job_id: str, progress: bool) -> dict:
    from concurrent.futures import TimeoutError as FutureTimeout

    from tqdm import tqdm

    total = manager.describe(job_id)["request_counts"]["total"]
    bar = tqdm(total=total, unit="row", file=sys.stderr, disable=not progress or not sys.stderr.isatty())
    try:
        while True:
            try:
                job = manager.wait(job_id, timeout=0.5)
            except (TimeoutError, FutureTimeout):  # the same class from Python 3.11 on, not before
                job = manager.describe(job_id)
            bar.n = (job.get("progress") or {}).get("done", 0)
            bar.refresh()
            if not job.get("running_here"):
                return job
    finally:
        bar.close()


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    BatchApp.launch_instance()
