"""`%mlx SUBCOMMAND ...` and `%%mlx chat`: the notebook's front door to the shared engine.

The first word picks a subcommand; the rest is parsed by that subcommand's own magic_arguments
parser, so `%mlx help` and `%mlx?` print real usage lines. Every failure is one line on stderr
(`mlx: ...`), never a traceback: a chat cell is prose, not code to debug.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.utils.process import arg_split
from traitlets import Float, Int, Unicode, observe

from mlx_nb.client.waiting import print_progress
from mlx_nb.formatting import human_bytes
from mlx_nb.magics.chat import ChatAnswer, ChatView, Conversation, interpolate
from mlx_nb.magics.tables import cache_table, models_table, prefix_table, status_table

NO_QUESTION = ("no question: write it on the lines below `%%mlx chat` (options go on that line: "
               "-s SYSTEM, -n MAX_TOKENS, -t TEMPERATURE, -i IMAGE, --new; %mlx help lists them)")
SUBCOMMANDS = ["chat", "map", "jobs", "train", "load", "unload", "models", "status", "cache", "batch", "connect", "disconnect",
               "reset", "help"]
CELL_SUBCOMMANDS = ("chat", "map")  # the others are line magics


def _is_terminal(shell) -> bool:
    """Terminal IPython prints every display update in full, so it gets plain text deltas instead."""
    return any(c.__name__ == "TerminalInteractiveShell" for c in type(shell).__mro__)


def _parse(subcommand, line: str):
    """Parse with the subcommand's magic_arguments parser; quotes group words and are removed."""
    try:
        argv = arg_split(line, posix=True)
    except ValueError as exc:  # e.g. an unclosed quote
        raise UsageError(str(exc)) from None
    return subcommand.parser.parse_args(argv)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    known = (UsageError, ValueError, KeyError, RuntimeError, ConnectionError, FileNotFoundError, TimeoutError)
    return text if text and isinstance(exc, known) else f"{type(exc).__name__}: {text}".rstrip(": ")


@magics_class
class MlxMagics(Magics):
    model = Unicode(None, allow_none=True, help="Model for this notebook (default: the server's / built-in)").tag(
        config=True)
    max_tokens = Int(512, help="Default answer length for %%mlx chat").tag(config=True)
    temperature = Float(0.0, help="Default temperature for %%mlx chat (0 = greedy, reproducible)").tag(config=True)
    max_turns = Int(20, help="Conversation turns kept and resent with each question").tag(config=True)
    update_hz = Float(10.0, help="Streaming display updates per second").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell, **kwargs)
        self.conversation = Conversation(self.max_turns)
        self.terminal = _is_terminal(shell)
        self._client = None
        self._batch_view = None

    @observe("model", "max_turns")
    def _config_changed(self, change) -> None:  # `%config MlxMagics.model = ...` takes effect at once
        target = getattr(self, "_client" if change["name"] == "model" else "conversation", None)
        if target is not None:  # None while config is applied in __init__
            setattr(target, "model" if change["name"] == "model" else "max_turns", change["new"])

    @property
    def client(self):
        if self._client is None:
            from mlx_nb.client import Client

            self._client = Client(model=self.model)
        return self._client

    # -- entry point --------------------------------------------------------------------------
    @no_var_expand
    @line_cell_magic
    def mlx(self, line: str, cell: Optional[str] = None):
        """Chat with the shared MLX engine. `%mlx help` lists the subcommands.

        `%%mlx chat [-s SYSTEM] [-i IMAGE] [-n MAX_TOKENS] [-t TEMPERATURE] [--model M] [--json-schema NAME] [--new]`
        with the question as the cell body; `{name}` is filled from your variables.
        """
        try:
            return self._dispatch(line, cell)
        except KeyboardInterrupt:
            self._fail("interrupted")
        except Exception as exc:
            self._fail(_one_line(exc))
        return None

    def _fail(self, message: str) -> None:
        print(f"mlx: {message}", file=sys.stderr)

    def _say(self, message: str) -> None:
        print(f"mlx: {message}")

    def _dispatch(self, line: str, cell: Optional[str]):
        line = interpolate(line, self.shell.user_ns)
        words = line.strip().split(None, 1)
        sub = words[0] if words else ("chat" if cell is not None else "help")
        rest = words[1] if len(words) > 1 else ""
        if sub.startswith("-") and cell is not None:  # `%%mlx -n 64` means chat
            sub, rest = "chat", line
        if sub not in SUBCOMMANDS:
            raise UsageError(f"unknown subcommand {sub!r}: one of {', '.join(SUBCOMMANDS)} (%mlx help)")
        if cell is not None and not cell.strip() and sub not in CELL_SUBCOMMANDS:
            cell = None  # `%%mlx status` with nothing below: the line magic was meant
        if cell is not None and sub not in CELL_SUBCOMMANDS:
            raise UsageError(f"%%mlx {sub} takes no cell body: use %mlx {sub}, or %%mlx chat for a question")
        return getattr(self, f"_sub_{sub}")(rest, cell)

    # -- chat ---------------------------------------------------------------------------------
    @magic_arguments(name="mlx chat")
    @argument("-s", "--system", help="system prompt for this conversation (kept until reset / --new)")
    @argument("-i", "--image", action="append", default=[], metavar="PATH", help="attach an image (repeatable)")
    @argument("-n", "--max-tokens", type=int, default=None, help="answer length limit (default 512)")
    @argument("-t", "--temperature", type=float, default=None, help="sampling temperature (default 0: greedy)")
    @argument("--model", default=None, help="model for this cell only")
    @argument("--json-schema", default=None, metavar="NAME",
              help="hold the answer to a JSON schema: the name of a variable holding a schema dict or a pydantic model")
    @argument("--new", action="store_true", help="start a new conversation")
    @argument("prompt", nargs="*", help="the question, in the line form `%%mlx chat QUESTION`")
    def _sub_chat(self, line: str, cell: Optional[str]):
        """Ask the model; the answer streams into the cell and becomes the cell's value."""
        args = _parse(self._sub_chat, line)
        if cell is not None and args.prompt:
            raise UsageError(f"unexpected {' '.join(args.prompt)!r} after the options: put the question in the cell")
        prompt = (interpolate(cell, self.shell.user_ns) if cell is not None else " ".join(args.prompt)).strip()
        if not prompt:
            raise UsageError(NO_QUESTION)
        if args.new:
            self.conversation.clear()
        if args.system:
            self.conversation.system = args.system
        schema = self._schema(args.json_schema)
        view = ChatView(self._mode(), self.update_hz)
        if self._mode() == "live":
            view.waiting(f"⏳ waiting for {args.model or self.client.model or 'the model'}")
        try:
            stream = self.client.stream(
                self.conversation.messages(prompt),
                images=args.image or None,
                max_tokens=self.max_tokens if args.max_tokens is None else args.max_tokens,
                temperature=self.temperature if args.temperature is None else args.temperature,
                model=args.model,
                progress=view.loading,
                response_format=schema,
            )
        except BaseException:
            view.withdraw()
            raise
        try:
            text = view.render(stream)
        except KeyboardInterrupt:
            self._fail(f"interrupted: request {stream.request_id} aborted")
            return None
        reply = stream.reply
        view.footer(reply)
        if reply is not None and reply.finish_reason != "abort":
            self.conversation.add(prompt, text)
        return ChatAnswer(text, reply, self.shell.execution_count)

    # -- jobs ---------------------------------------------------------------------------------
    @magic_arguments(name="mlx map")
    @argument("data", help="the variable holding the rows: a DataFrame, a Series, or a list of strings or dicts")
    @argument("--out", default=None, metavar="NAME", help="keep the result in this variable (else: the cell's value)")
    @argument("-s", "--system", default=None, help="system prompt for every row")
    @argument("-n", "--max-tokens", type=int, default=256, help="answer length limit per row (default 256)")
    @argument("-t", "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    @argument("--model", default=None, help="model for this map")
    @argument("--json-schema", default=None, metavar="NAME",
              help="hold each answer to a schema: a variable holding a schema dict, a pydantic model or a dataclass")
    def _sub_map(self, line: str, cell: Optional[str]):
        """The cell body, a prompt template naming the rows' fields (`{text}`), over every row of DATA as a
        job (Client.map): a progress widget while it runs, the answers aligned with the rows after."""
        args = _parse(self._sub_map, line)
        if cell is None or not cell.strip():
            raise UsageError("write the prompt template in the cell below `%%mlx map DATA`, naming the rows' "
                             "fields: Classify: {text}")
        ns = self.shell.user_ns
        if args.data not in ns:
            raise UsageError(f"no variable {args.data!r} in this notebook: give the name of the table to map over")
        schema = None
        if args.json_schema is not None:
            if args.json_schema not in ns:
                raise UsageError(f"--json-schema {args.json_schema}: no variable {args.json_schema!r} in this "
                                 "notebook: define the schema first")
            schema = ns[args.json_schema]
        result = self.client.map(ns[args.data], cell.strip(), system=args.system, model=args.model, schema=schema,
                                 max_tokens=args.max_tokens, temperature=args.temperature)
        if args.out:
            ns[args.out] = result
            failed = int(result["error"].notna().sum()) if hasattr(result, "columns") else len(result.errors)
            self._say(f"{len(result)} rows -> {args.out} ({failed} with an error)")
            return None
        return result

    @magic_arguments(name="mlx jobs")
    def _sub_jobs(self, line: str, cell=None):
        """The jobs the engine keeps: id, status, rows done of total, errors (newest first)."""
        _parse(self._sub_jobs, line)
        jobs = self.client.jobs()
        if not jobs:
            self._say("no jobs")
            return None
        for job in jobs:
            counts = job.get("request_counts") or {}
            done = counts.get("completed", 0) + counts.get("failed", 0)
            print(f"{job['id']}  {job.get('status', '?'):<11} {done}/{counts.get('total', 0)} rows, "
                  f"{counts.get('failed', 0)} errors  {(job.get('metadata') or {}).get('mlx_kind', 'batch')}")
        return None

    @magic_arguments(name="mlx train")
    @argument("data", help="the variable holding the rows (conversations, a DataFrame with prompt/completion or "
              "messages columns), or the path of a JSONL file")
    @argument("--name", required=True, help="the adapter's name: it is served as MODEL@NAME")
    @argument("--out", default=None, metavar="NAME", help="keep the TrainJob in this variable")
    @argument("--model", default=None, help="the base model (default: this notebook's)")
    @argument("--iters", type=int, default=None, help="training steps (default: one pass over the rows)")
    @argument("--learning-rate", type=float, default=None, help="Adam's learning rate (default 2e-4)")
    @argument("--rank", type=int, default=None, help="the LoRA rank (default 8)")
    def _sub_train(self, line: str, cell=None):
        """Fine-tune a LoRA adapter on DATA (Client.train): a loss panel while it trains; then chat with it
        as MODEL@NAME (`%%mlx chat --model MODEL@NAME`)."""
        args = _parse(self._sub_train, line)
        ns = self.shell.user_ns
        if args.data in ns:
            data = ns[args.data]
        elif os.path.isfile(os.path.expanduser(args.data)):
            data = args.data
        else:
            raise UsageError(f"no variable {args.data!r} in this notebook and no such file: give the rows' "
                             "variable or a JSONL path")
        settings = {k: v for k, v in (("iters", args.iters), ("learning_rate", args.learning_rate),
                                      ("rank", args.rank)) if v is not None}
        job = self.client.train(data, name=args.name, base=args.model or self.model, **settings)
        if args.out:
            ns[args.out] = job
        self._say(f"fine-tune {job.status()['status']}: chat with it as {job.model}")
        return None

    def _schema(self, name: Optional[str]) -> Any:
        """The schema `--json-schema NAME` names: a dict or a pydantic model class in the notebook."""
        if name is None:
            return None
        from mlx_nb.client.content import response_format_of

        value = self.shell.user_ns.get(name)
        if value is None:
            raise UsageError(f"--json-schema {name}: no variable {name!r} in this notebook: define the schema first")
        try:
            return response_format_of(value)
        except TypeError as exc:
            raise UsageError(f"--json-schema {name}: {exc}") from None

    def _mode(self) -> str:
        if self.terminal:
            return "terminal"
        if os.environ.get("MLX_NB_NO_STREAM", "").lower() in ("1", "true", "yes"):
            return "final"
        return "live"

    # -- engine and server --------------------------------------------------------------------
    @magic_arguments(name="mlx load")
    @argument("model", help="a built-in name (smollm2-135m-instruct, tiny-llama, ...), a local dir, .gguf or hub id")
    def _sub_load(self, line: str, cell=None):
        """Make MODEL this notebook's model (embedded: load it now)."""
        args = _parse(self._sub_load, line)
        if not self.client.embedded:
            self.client.load(args.model, progress=print_progress(sys.stdout))
            self.model = args.model
            self._say(f"using {args.model} on {self.client.backend}")
            return
        self._say(f"loading {args.model} ...")
        engine = self.client.load(args.model, progress=print_progress(sys.stdout)).engine
        self.model = args.model
        self._say(f"{args.model} ready ({engine.loaded.kind}, context {engine.loaded.context_length} tokens)")

    @magic_arguments(name="mlx unload")
    @argument("model", help="a model the server loaded on demand (not its default one), or an embedded engine")
    def _sub_unload(self, line: str, cell=None):
        """Free MODEL's memory now (a server loads it again when a request names it)."""
        args = _parse(self._sub_unload, line)
        out = self.client.unload(args.model)
        self._say(f"{args.model} unloaded" if out.get("unloaded_now") else f"{args.model} was not loaded")

    @magic_arguments(name="mlx models")
    def _sub_models(self, line: str, cell=None):
        """List the models the backend can serve."""
        _parse(self._sub_models, line)
        self._show(models_table(self.client.models(), self.client.model_name(), self.client.model_states()))

    @magic_arguments(name="mlx status")
    def _sub_status(self, line: str, cell=None):
        """Engine state: model, batch size, queue, tokens, memory, live requests."""
        _parse(self._sub_status, line)
        self._show(status_table(self.client.status(), self.client.backend))

    @magic_arguments(name="mlx cache")
    @argument("action", nargs="?", choices=["prefix", "save", "load", "clear"], default=None,
              help="the prefix cache instead: show it (prefix), write it to disk now (save), read the disk "
                   "into memory (load) or empty it (clear)")
    @argument("--disk", action="store_true", help="with clear: delete the prefix cache's files too")
    @argument("--request", default=None, metavar="ID",
              help="a live request's cache (default: the newest decoding request, else a fresh cache)")
    def _sub_cache(self, line: str, cell=None):
        """The KV cache by kind of layer: type, offset, shapes, dtype, bytes; or the prefix cache."""
        args = _parse(self._sub_cache, line)
        if args.action is not None:
            return self._prefix_cache(args.action, args.disk)
        request = args.request
        if request is None:
            decoding = [r["id"] for r in self.client.status().get("requests", []) if r.get("phase") == "decode"]
            request = decoding[-1] if decoding else None
        self._show(cache_table(self.client.cache_layout(request)))

    def _prefix_cache(self, action: str, disk: bool) -> None:
        done = ""
        if action == "clear":
            out = self.client.prefix_cache("clear", disk=disk)
            done = f"cleared {out.get('entries', 0)} entries ({human_bytes(out.get('bytes'))}) from memory"
            if "disk_entries" in out:
                done += f", {out['disk_entries']} ({human_bytes(out.get('disk_bytes'))}) from disk"
        elif action in ("save", "load"):
            self.client.prefix_cache(action)
            done = "written to disk" if action == "save" else "read from disk"
        self._show(prefix_table(self.client.status().get("prefix_cache") or {}, done))

    @magic_arguments(name="mlx batch")
    def _sub_batch(self, line: str, cell=None):
        """A live timeline of the batch: who joins, who leaves, batch size."""
        _parse(self._sub_batch, line)
        from mlx_nb.widgets import BatchVisualizer

        if self._batch_view is not None:  # one live view per notebook: stop the previous one's updates
            self._batch_view.close()
        self._batch_view = BatchVisualizer(self.client)
        self._show(self._batch_view)

    @magic_arguments(name="mlx connect")
    @argument("url", nargs="?", default=None, help="OpenAI-compatible base URL (default: $MLX_NB_URL)")
    @argument("--token", default=None, help="API key / Jupyter token (default: $MLX_NB_TOKEN)")
    def _sub_connect(self, line: str, cell=None):
        """Send this notebook's requests to a server."""
        from mlx_nb.client import Client

        args = _parse(self._sub_connect, line)
        url = args.url or os.environ.get("MLX_NB_URL")
        if not url:
            raise UsageError("give a URL (e.g. http://127.0.0.1:8888/mlx/v1): MLX_NB_URL is not set")
        token = args.token or os.environ.get("MLX_NB_TOKEN")
        self._client = Client(url, api_key=token, model=self.model)
        self._say(f"requests now go to {self._client.backend}")

    @magic_arguments(name="mlx disconnect")
    def _sub_disconnect(self, line: str, cell=None):
        """Use an embedded engine in this kernel instead of a server."""
        from mlx_nb.client import Client

        _parse(self._sub_disconnect, line)
        self._client = Client(model=self.model, embedded=True)
        self._say("requests now go to an embedded engine in this kernel")

    @magic_arguments(name="mlx reset")
    def _sub_reset(self, line: str, cell=None):
        """Forget this notebook's conversation (and its system prompt)."""
        _parse(self._sub_reset, line)
        self.conversation.clear()
        self._say("conversation cleared")

    @magic_arguments(name="mlx help")
    def _sub_help(self, line: str, cell=None):
        """This list."""
        lines = [f"mlx ({self.client.backend}): {{name}} in a question is filled from your variables "
                 "(unknown names and {{name}} stay as written)", ""]
        for sub in SUBCOMMANDS:
            fn = getattr(self, f"_sub_{sub}")
            usage = " ".join(fn.parser.format_usage().split()).replace("usage: ", "").lstrip(": ")
            summary = (fn.parser.description or "").strip().splitlines()[0]
            lines += [f"  {'%' + usage if sub in CELL_SUBCOMMANDS else usage}", f"      {summary}"]
        print("\n".join(lines))

    def _show(self, obj) -> None:
        from IPython.display import display

        display(obj)


def give_empty_cells_a_body(lines: list[str]) -> list[str]:
    """IPython refuses a cell magic whose body is empty before calling it, with a generic message;
    a `%%mlx ...` cell with nothing below gets a blank body instead, so %mlx explains itself."""
    if lines and lines[0].startswith("%%mlx") and not "".join(lines[1:]).strip():
        return [lines[0].rstrip("\n") + "\n", "\n"]
    return lines


def load_ipython_extension(ip) -> None:
    ip.register_magics(MlxMagics)
    if give_empty_cells_a_body not in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.append(give_empty_cells_a_body)


def unload_ipython_extension(ip) -> None:
    if give_empty_cells_a_body in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.remove(give_empty_cells_a_body)
