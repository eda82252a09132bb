"""Small tables for `%mlx status / cache / models / help`: HTML in a notebook, text in a terminal.

A `Table` carries both `_repr_html_` and `__repr__`, so `display(table)` sends one bundle and
each frontend picks what it can show.
"""

from __future__ import annotations

import html
from typing import Any, Optional

from mlx_nb.formatting import human_bytes


class Table:
    def __init__(self, columns: list[str], rows: list[list[Any]], title: str = "", note: str = ""):
        self.columns, self.rows, self.title, self.note = columns, [[_cell(v) for v in r] for r in rows], title, note

    def __repr__(self) -> str:
        widths = [max([len(c)] + [len(r[i]) for r in self.rows]) for i, c in enumerate(self.columns)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out = [self.title] if self.title else []
        if any(self.columns):
            out += [line(self.columns), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows]
        return "\n".join(out + ([self.note] if self.note else []))

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th style='text-align:left'>{esc(c)}</th>" for c in self.columns)
        head = f"<thead><tr>{head}</tr></thead>" if any(self.columns) else ""
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(v)}</td>" for v in r) + "</tr>"
                       for r in self.rows)
        title = f"<b>{esc(self.title)}</b>" if self.title else ""
        note = f"<div style='opacity:.7'>{esc(self.note)}</div>" if self.note else ""
        table = f"<table>{head}<tbody>{body}</tbody></table>"
        return f"<div class='mlx-nb-table'>{title}{table}{note}</div>"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def kernels_line(status: dict) -> Optional[str]:
    """Which path runs the model: mlx-nb's CPU kernels (which instruction set, what is on them) or
    MLX's own ops, and why."""
    info = (status.get("runtime") or {}).get("kernels")
    if not info:
        return None
    if info.get("path") != "native":
        return f"not in use: {info.get('reason')}; MLX's own ops run"
    kernels = status.get("kernels") or {}
    on = ", ".join(f"{n} {kind}" for kind, n in (kernels.get("swapped") or {}).items())
    acts = f", {kernels['activations']} activations" if kernels.get("activations") else ""
    return f"{info['isa']}, {info['threads']} threads{acts}" + (f": {on}" if on else "")


def weights_line(weights: Optional[dict]) -> Optional[str]:
    """How the weights are held: each format with its count of matrices, then the bytes."""
    if not weights or not weights.get("formats"):
        return None
    formats = ", ".join(f"{kind} x{n}" for kind, n in weights["formats"].items())
    return f"{formats} ({human_bytes(weights.get('bytes'))})"


def _sampling_line(defaults: Optional[dict]) -> Optional[str]:
    """What API requests that set no sampling get (notebook chats stay greedy unless asked)."""
    if not defaults:
        return None
    values = ", ".join(f"{k} {v}" for k, v in (defaults.get("values") or {}).items())
    return f"{values} ({defaults['source']})" if values else "none from the model: the API's (temperature 1.0)"


def status_table(status: dict, backend: str) -> Table:
    mem = status.get("memory") or {}
    policy = status.get("policy") or {}
    from mlx_nb.models.progress import describe

    rows = [
        ["backend", backend],
        ["model", status.get("model")],
        ["state", describe(status) if status.get("loading") or status.get("error") else "ready"],
        ["batching", f"{policy['mode']} ({policy['source']}): {policy['reason']}" if policy else None],
        ["CPU kernels", kernels_line(status)],
        ["weights", weights_line(status.get("weights"))],
        ["KV cache", _kv_line(status.get("kv_cache"))],
        ["sampling defaults", _sampling_line(status.get("sampling_defaults"))],
        ["batch size (peak)", f"{status.get('batch_size', 0)} ({status.get('peak_batch_size', '-')})"],
        ["queued / prefilling", f"{status.get('queue_length', 0)} / {status.get('prefilling', 0)}"],
        ["steps", status.get("steps")],
        ["tokens generated / prompt", f"{status.get('generated_tokens', 0)} / {status.get('prompt_tokens', 0)}"],
        ["memory active / peak", f"{human_bytes(mem.get('active_bytes'))} / {human_bytes(mem.get('peak_bytes'))}"],
    ]
    if status.get("backend"):  # a server fronting another engine: say which, and what it does not show
        rows.insert(1, ["fronting", status["backend"]])
        if status.get("not_exposed"):
            rows.append(["not shown", status["not_exposed"]])
    requests = status.get("requests") or []
    note = "; ".join(f"{r['id']}: {r['phase']} {r.get('generated_tokens', 0)}/{r.get('max_tokens', '?')} tokens"
                     for r in requests) or "no live requests"
    return Table(["", ""], rows, title="mlx engine status", note=note)


def _kv_line(kv: Optional[dict]) -> Optional[str]:
    """'8-bit keys and values (groups of 64)', 'float', or float with why a setting asked for does not apply."""
    if not kv:
        return None
    if kv.get("bits"):
        return f"{kv['bits']}-bit keys and values (groups of {kv['group_size']})"
    return "float" + (f" ({kv['note']})" if kv.get("note") else "")


def _layer_row(layer: dict) -> list:
    if layer.get("bits"):  # a quantized KV layer: its arrays are words, scales and biases
        layer = {**layer, "dtype": f"{layer['bits']}-bit"}
    if layer.get("type") == "CacheList":
        members = layer.get("members") or []
        kind = "CacheList[" + ", ".join(m.get("type", "?") for m in members) + "]"
        shapes = " | ".join(_shapes(m) for m in members)
        offset = " | ".join(str(m.get("offset")) for m in members)
        dtype = next((m.get("dtype") for m in members if m.get("dtype")), None)
    else:
        kind, shapes, offset, dtype = layer.get("type"), _shapes(layer), layer.get("offset"), layer.get("dtype")
    return [layer.get("layer"), kind, offset, shapes, dtype, human_bytes(layer.get("nbytes")), layer.get("trimmable")]


def _shapes(layer: dict) -> str:
    shapes = layer.get("shapes") or []
    return ", ".join("x".join(map(str, s)) for s in shapes) or "empty"


def cache_table(layout: dict) -> Table:
    """One row per kind of layer: identical layers (a fresh cache's 30 empty ones) share a row."""
    from mlx_nb.pictures.cache import layer_span, runs

    layers = layout.get("layers") or []
    total = sum(layer.get("nbytes") or 0 for layer in layers)
    who = f"request {layout['request']}" if layout.get("request") else "a fresh cache (no request given)"
    rows = []
    for numbers, layer in runs(layers):
        row = _layer_row(layer)
        row[0] = layer_span(numbers, prefix="")
        row[5] += f" x{len(numbers)}" if len(numbers) > 1 else ""
        rows.append(row)
    return Table(["layers", "type", "offset", "shapes", "dtype", "bytes", "trimmable"], rows,
                 title=f"KV cache of {layout.get('model')}: {who}", note=f"{len(layers)} layers, {human_bytes(total)}")


def prefix_table(prefix: dict, done: str = "") -> Table:
    """The prefix cache in memory and on disk: entries, bytes against their budgets, hits."""
    if not prefix.get("enabled"):
        return Table(["", ""], [["prefix cache", "off"]], title="prefix cache", note=done)
    disk = prefix.get("disk") or {}
    rows = [["memory", prefix.get("entries"), human_bytes(prefix.get("bytes")), human_bytes(prefix.get("budget_bytes")),
             "-"]]
    if disk.get("enabled"):
        rows.append(["disk", disk.get("entries"), human_bytes(disk.get("bytes")), human_bytes(disk.get("budget_bytes")),
                     disk.get("folder")])
    hits = ", ".join(f"{k} {v}" for k, v in (prefix.get("hits") or {}).items())
    note = "; ".join(x for x in (done, f"lookups: {hits}", f"{prefix.get('tokens_saved', 0)} prompt tokens not re-read",
                                 "" if disk.get("enabled") else "memory only (no prefix_cache_dir)") if x)
    return Table(["where", "entries", "bytes", "budget", "folder"], rows, title="prefix cache", note=note)


def models_table(names: list[str], current: Optional[str], states: Optional[dict] = None) -> Table:
    states = states or {}
    return Table(["", "model", "state"], [["*" if n == current else "", n, states.get(n, "available")] for n in names],
                 title="models", note="* = this notebook's model; %mlx load NAME to switch")
