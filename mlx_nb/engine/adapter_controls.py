"""LoRA adapters on a running Engine: load one from an mlx_lm adapter folder, unload it, list them;
a request names one (`adapter=`) and its row decodes with it, beside rows with other adapters or
none (models/lora.py). A mixin of Engine: the model's modules change on the engine thread
(`_call`), between two batch steps, so no forward ever sees half an adapter."""

from __future__ import annotations

from typing import Optional

from mlx_nb.engine.types import RequestError


class AdapterControls:
    def load_adapter(self, name: str, path: str) -> dict:
        """Read the adapter folder at `path` (what mlx_lm.lora writes) and apply it to requests that
        name `name`. Returns what it is (rank, scale, projections, bytes). A folder that is not an
        adapter, or one trained on another model's shapes, is a one-line AdapterError."""
        from mlx_nb.models.adapters import AdapterError, read_adapter
        from mlx_nb.models.lora import install

        if not name or "@" in name:
            raise AdapterError(f"an adapter's name must be non-empty and without '@', not {name!r}")
        self.wait_ready()
        if self.loaded.kind == "vision":
            raise AdapterError(f"{self.model_name} is a vision model: adapters are applied to language models only")
        adapter = read_adapter(name, path)  # the file is read on the caller's thread

        def put():
            install(self.loaded.model, self._loop.runner.lora, adapter)
            return adapter.describe()

        return self._call(put)

    def unload_adapter(self, name: str) -> dict:
        """Take adapter `name` off the model; refused while a request decodes with it."""
        from mlx_nb.models.lora import uninstall

        self.wait_ready()

        def take():
            runner = self._loop.runner
            if runner.lora is None or name not in runner.lora.adapters:
                raise RequestError(f"no adapter named {name} is loaded on {self.model_name}", "adapter")
            holding = {lv.id: lv for lv in [*runner.live(), *runner.lane.rows()]}  # job rows waiting their turn too
            using = [i for i, lv in holding.items() if lv.extra.get("adapter") == name]
            if using:
                raise RequestError(f"adapter {name} is in use by {len(using)} request(s): wait for them or abort "
                                   "them, then unload it", "adapter")
            return uninstall(self.loaded.model, runner.lora, name).describe()

        return self._call(take)

    def adapters(self) -> list[dict]:
        """The adapters loaded on this engine (a snapshot read on any thread: it never waits for a
        step, so an HTTP handler may call it on the event loop)."""
        runner = self._loop.runner
        return self._adapters_of(runner) if self.ready and runner is not None else []

    @property
    def adapter_bytes(self) -> int:
        """What the loaded adapters hold (the memory budget counts it with the weights)."""
        runner = self._loop.runner
        lora = runner.lora if runner is not None else None
        return sum(a.nbytes for a in list(lora.adapters.values())) if lora is not None else 0

    def _adapters_on_thread(self) -> list[dict]:
        return self._adapters_of(self._loop.runner)

    @staticmethod
    def _adapters_of(runner) -> list[dict]:
        lora = runner.lora
        return [a.describe() for a in list(lora.adapters.values())] if lora is not None else []


def check_adapter(loop, model_name: str, name: Optional[str], loaded, extra: dict) -> None:
    """A request's adapter, checked at submit: loaded on this engine (`loop`), for a language model.
    Its rows reuse prefixes only among this adapter load's own (engine/caches/prefix.py)."""
    if name is None:
        return
    lora = loop.runner.lora if loop.runner is not None else None
    if loaded.kind == "vision" or lora is None:
        raise RequestError(f"{model_name} takes no adapters (a vision model)", "adapter")
    if not isinstance(name, str) or name not in lora.adapters:
        have = ", ".join(sorted(lora.adapters)) or "none"
        raise RequestError(f"no adapter named {name} is loaded on {model_name} (loaded: {have}): load it "
                           "first (Engine.load_adapter, %mlx load MODEL@ADAPTER)", "adapter")
    extra["adapter"] = name
