"""EngineConfig: every setting of one Engine, declared once.

`Engine(model, max_batch=8)` and `Engine(model, config=EngineConfig(max_batch=8))` read it; the
Jupyter server's `c.MLXExtension.*` traits are generated from it (jupyter_ext/settings.py), and the
settings page of the docs is rendered from both (`mlx_nb.engine.config.settings_rows`), so a setting
cannot be missing from any of them. Each field carries its help text; a wrong value is refused when
the config is made, in one line naming the setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

BATCH_POLICIES = (None, "batched", "prefill_alone", "sequential")


def setting(default: Any, help: str, *, server: bool = True) -> Any:
    """A config field with its help; `server=False`: an Engine-only setting the server does not expose
    as a trait (it has its own, e.g. per-model `draft_models` for `draft_model`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, "server": server})
    return field(default=default, metadata={"help": help, "server": server})


@dataclass
class EngineConfig:
    # -- the batch --------------------------------------------------------------------------
    max_batch: int = setting(32, "Most requests decoded together in one batch.")
    prefill_batch: int = setting(
        32, "Most requests whose prompts are read together in one prefill step (padded to the longest chunk).")
    prefill_step_size: int = setting(512, "Most prompt tokens a request reads per prefill chunk.")
    prefill_budget_s: Optional[float] = setting(
        0.25, "While requests decode, prefill chunks shrink so a step takes about this long (None: never shrink), "
        "so a long prompt does not stall the running streams.")
    batch_policy: Optional[str] = setting(
        None, "None: batch as the measured compatibility matrix says for the model's family; 'batched', "
        "'prefill_alone' or 'sequential' force that mode (the sweep that measures the matrix does).", server=False)
    job_rows_under_load: int = setting(
        1, "A dataset job's minimum share: the batch slots its rows get beside interactive requests once those "
        "have held the batch alone for a second (job rows yield to an arriving request and resume after): higher "
        "finishes jobs sooner under load, lower keeps long chats closer to their idle speed.")
    job_batch: int = setting(
        16, "Most dataset-job rows in the batch at once, with no interactive request running. A job's step is "
        "what a chat arriving during the job waits for: a narrower job batch makes shorter steps (on the default "
        "model 16 rows decode as many tokens a second as 32, in half the time a step), a wider one can read more "
        "tokens a second on larger models.")
    # -- the model ---------------------------------------------------------------------------
    quantize: Optional[int] = setting(
        None, "Quantize a float checkpoint to 4 or 8 bits at load, for the CPU kernels (None: $MLX_NB_QUANTIZE, "
        "else keep it float). Quantized checkpoints (GGUF, mlx-community 4/8-bit) run as shipped either way.")
    speculation: bool = setting(
        True, "Greedy rows of a small batch verify prompt-lookup guesses (tokens that repeat what the "
        "conversation holds), when the measured step times say it pays; the tokens are the same either way.")
    draft_model: Optional[str] = setting(
        None, "A draft model of the same tokenizer (a name, folder or GGUF) whose greedy guesses the model "
        "verifies in the batch, instead of prompt lookup's; the tokens stay the model's own.", server=False)
    # -- caches ------------------------------------------------------------------------------
    kv_bits: Optional[int] = setting(
        None, "Quantize each request's keys and values to 8 or 4 bits (None: float): half the KV memory or less, "
        "rows still batched. A model that cannot hold them keeps float ones and its status says why.")
    kv_group_size: int = setting(64, "Values sharing one scale and bias in the quantized KV cache: 32, 64 or 128.")
    prefix_cache: bool = setting(True, "Reuse cached prompt prefixes across requests and turns.")
    prefix_cache_bytes: Optional[int] = setting(
        None, "Byte budget of the prompt-prefix cache (None: the engine's default).")
    prefix_cache_dir: Optional[str] = setting(
        None, "Folder where the prefix cache is also kept, so a restarted engine skips prompts it read before "
        "(None: memory only).", server=False)
    prefix_cache_disk_bytes: Optional[int] = setting(
        None, "Byte budget of the prefix cache on disk (None: 4 GiB, or a tenth of the free space if less).")
    # -- memory ------------------------------------------------------------------------------
    memory_limit: Optional[int] = setting(
        None, "Bytes of memory the engine may use (MLX's limit; prefix-cache entries are evicted past it). "
        "None: no limit.")
    buffer_cache_bytes: Optional[int] = setting(
        None, "Most freed buffers MLX keeps for reuse while serving (emptied when idle). None: the engine's default.")
    event_capacity: int = setting(4096, "Batch events kept for the timeline and the events route.", server=False)
    # -- images ------------------------------------------------------------------------------
    image_roots: Optional[list] = setting(
        None, "Directories local image paths may come from (None: the current directory).", server=False)
    allow_remote_images: bool = setting(False, "Let requests fetch images from http(s) URLs.")
    allow_private_image_hosts: bool = setting(
        False, "Let remote images come from loopback, private, link-local or reserved addresses too.")
    max_image_bytes: int = setting(20 * 2**20, "Largest image (encoded bytes) a request may send or reference.")
    max_image_pixels: int = setting(40_000_000, "Largest image (width x height) a request may send.")

    def __post_init__(self):
        from mlx_nb.engine.caches.kv_quant import KVQuantization
        from mlx_nb.engine.scheduling.background import BackgroundLane

        KVQuantization.parse(self.kv_bits, self.kv_group_size)  # a wrong setting is refused here, in one line
        BackgroundLane(self.job_rows_under_load, self.job_batch)  # likewise
        if self.batch_policy not in BATCH_POLICIES:
            raise ValueError("batch_policy must be None, 'batched', 'prefill_alone' or 'sequential', "
                             f"not {self.batch_policy!r}")
        for name in ("max_batch", "prefill_batch", "prefill_step_size", "event_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
        self.kv_bits = self.kv_bits or None  # 0 is float, as None

    @classmethod
    def of(cls, config: Optional["EngineConfig"] = None, **settings: Any) -> "EngineConfig":
        """`config` (or the defaults) with `settings` over it; an unknown name is a TypeError that
        lists the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"Engine has no setting {', '.join(map(repr, unknown))}: the settings are "
                            f"{', '.join(sorted(known))}")
        base = config if config is not None else cls()
        return dataclasses.replace(base, **settings) if settings else base

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def settings_rows() -> list[dict]:
    """One row per setting, for docs and help: name, type, default and help, and whether the server
    exposes it as a `c.MLXExtension` trait."""
    import typing

    hints = typing.get_type_hints(EngineConfig)
    rows = []
    for f in dataclasses.fields(EngineConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append({"name": f.name, "type": hints[f.name], "default": default, "help": f.metadata["help"],
                     "server": f.metadata["server"]})
    return rows
