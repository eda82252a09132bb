"""How a loaded model may batch, decided from the measured compatibility matrix, never a hand list.

- `batched`: the matrix verified that prompts prefilled together give the tokens each gives alone.
- `prefill_alone`: each prompt is prefilled on its own (its state would read a batch's padding),
  then decodes in the shared batch.
- `sequential`: wrong or failing batched even with prompts prefilled alone, or a cache type that
  cannot merge: served one request at a time through mlx_lm's generate_step (`sequential.py`).
- `refused`: the model cannot run on this backend at all: not loaded, with a one-line reason.

An architecture the matrix has never seen (a newer mlx-lm, an `untested` entry, cache types its
entry never had, or a `batched` verdict measured on another version of the package) takes the
safe path: plain KV caches batch, anything else is prefilled alone; `Engine.status()["policy"]`
says which policy applies and why. A batched verdict for caches that are not all plain KV (or for
an unseen architecture) is checked on the model's own weights at load (`batch_probe.py`).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any, Optional

from mlx_nb.compat import matrix
from mlx_nb.engine.caches.layout import is_batchable
from mlx_nb.models.cache_types import cache_type_name

MODES = ("batched", "prefill_alone", "sequential", "refused")
DOC = "docs/compatibility.md"


@dataclass(frozen=True)
class BatchPolicy:
    mode: str  # one of MODES
    # "matrix" | "unseen" | "caches" (a cache that cannot merge) | "forced" (by the caller) | "checked"
    # (the load-time check on the model's own weights overruled a batched verdict)
    source: str
    reason: str  # one line
    architecture: str
    package: str = "mlx_lm"
    check: Optional[dict] = None  # the load-time check on the model's own weights (batch_probe.py)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def architecture_of(loaded) -> tuple[str, str]:
    """(package, architecture): for a text model the mlx_lm module that built it, which is what the
    matrix is keyed by (its model_type after mlx_lm's remapping, unless another module's Model was
    built, as for an architecture remap); for a vision model its model_type."""
    model_type = str(loaded.config.get("model_type", "unknown"))
    if loaded.kind == "vision":
        return "mlx_vlm", model_type
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError:  # an mlx_lm without the table: model types are module names
        MODEL_REMAPPING = {}
    name = MODEL_REMAPPING.get(model_type, model_type)
    module = sys.modules.get(f"mlx_lm.models.{name}")  # imported by the load
    cls = type(loaded.model)
    if getattr(module, "Model", None) is cls or not cls.__module__.startswith("mlx_lm.models."):
        return "mlx_lm", name
    return "mlx_lm", cls.__module__.rsplit(".", 1)[-1]


def policy_for(loaded, forced: Optional[str] = None) -> BatchPolicy:
    package, arch = architecture_of(loaded)
    if loaded.sequential:  # the model itself says so (models/vision.py: state carried per request)
        return BatchPolicy("sequential", "model", f"{arch}: {loaded.sequential}: requests are served one at a time",
                           arch, package)
    if package == "mlx_vlm":  # the file the vision loader honours too (MLX_NB_VISION_COMPAT may name another)
        import json

        from mlx_nb.models.vision import verdict_file

        path = verdict_file()
        data = json.loads(path.read_text()) if path is not None and path.exists() else {}
    else:
        data = matrix.read(package) or {}
    return decide(arch, loaded.make_cache(), package, forced=forced, entries=matrix.index(data),
                  stale=_stale(package, data))


def _stale(package: str, data: dict) -> Optional[str]:
    """'measured with mlx-lm 0.32.2, installed 0.33.0' when the model code may have changed since."""
    from importlib.metadata import PackageNotFoundError, version

    measured = data.get("versions", {}).get(package)
    dist = package.replace("_", "-")
    try:
        installed = version(dist)
    except PackageNotFoundError:
        return None
    return None if measured in (None, installed) else f"measured with {dist} {measured}, installed {installed}"


def decide(
    architecture: str,
    caches: list,
    package: str = "mlx_lm",
    *,
    forced: Optional[str] = None,
    entries: Optional[dict] = None,
    stale: Optional[str] = None,
) -> BatchPolicy:
    """The policy for `architecture` with these (fresh) layer caches; `entries` defaults to the
    shipped matrix for `package`; `forced` (a mode but `refused`) overrides the matrix, except that
    caches which cannot merge are always served sequentially.
    `stale` (why) says the matrix was measured on another version of the model code: a verdict
    of `batched` then covers only plain KV caches (wrong answers are what we never risk)."""
    # The vision adapter's rope-delta pseudo-cache holds no tokens: it is never part of a verdict.
    caches = [c for c in caches if cache_type_name(c) != "RopeDeltaCache"]
    names = [cache_type_name(c) for c in caches]
    if forced is not None and (forced == "sequential" or not unmergeable(caches)):
        return BatchPolicy(forced, "forced", f"{forced} as the caller asked", architecture, package)
    cannot = unmergeable(caches)
    if cannot:
        return BatchPolicy("sequential", "caches", f"{architecture} uses {cannot} caches, which cannot join a "
                           "batch: requests are served one at a time", architecture, package)
    table = matrix.entries(package) if entries is None else entries
    entry = table.get(architecture)
    if entry is None or entry["verdict"] == "untested":
        why = "is not in the compatibility matrix" if entry is None else f"could not be measured ({entry['reason']})"
        return _safe(architecture, package, names, f"{architecture} {why}")
    unseen = matrix.leaf_types(names) - matrix.leaf_types(entry.get("cache_types", []))
    if unseen and entry["verdict"] == "batched":
        return _safe(architecture, package, names,
                     f"{architecture} was measured without {sorted(unseen)} caches")
    if stale and entry["verdict"] == "batched":
        return _safe(architecture, package, names, f"{architecture} was {stale}")
    return BatchPolicy(entry["verdict"], "matrix", f"{architecture}: {entry['reason']}", architecture, package)


def _safe(architecture: str, package: str, names: list, why: str) -> BatchPolicy:
    if all(n == "KVCache" for n in matrix.leaf_types(names)):
        return BatchPolicy("batched", "unseen", f"{why}; plain KV caches batch safely", architecture, package)
    return BatchPolicy("prefill_alone", "unseen", f"{why}; its {sorted(matrix.leaf_types(names))} caches are "
                       "prefilled one request at a time, as a precaution", architecture, package)


def needs_check(policy: BatchPolicy, caches: list) -> bool:
    """Whether to check on the model's own weights before batching its prompts: a batched verdict
    for caches that are not all plain KV caches, or for an architecture the matrix has not seen."""
    if policy.mode != "batched" or policy.source in ("forced", "caches"):
        return False
    names = [cache_type_name(c) for c in caches if cache_type_name(c) != "RopeDeltaCache"]
    return policy.source == "unseen" or not all(n == "KVCache" for n in matrix.leaf_types(names))


def after_check(policy: BatchPolicy, result: dict) -> BatchPolicy:
    """The policy once the load-time check has run: prompts prefilled alone if it disagreed."""
    from dataclasses import replace

    if result["agrees"]:
        return replace(policy, check=result)
    return BatchPolicy("prefill_alone", "checked", f"{policy.architecture}: on this model's own weights, prompts "
                       f"read together differ from alone (first-token log-probabilities by up to "
                       f"{result['max_difference']:.3g}): each is prefilled on its own", policy.architecture,
                       policy.package, result)


def refusal(model_name: str, policy: BatchPolicy) -> str:
    """The one-line load error for a refused model."""
    return f"{model_name} cannot run here: {policy.reason} (see {DOC})"


def unmergeable(caches: list) -> list[str]:
    """Names of the cache classes (CacheList members included) BatchGenerator cannot merge."""
    return sorted({type(c).__name__ for c in _leaves(caches) if not is_batchable(c)})


def _leaves(caches: list) -> list:
    out = []
    for c in caches:
        members = getattr(c, "caches", None)
        out.extend(_leaves(list(members)) if members is not None else [c])
    return out
