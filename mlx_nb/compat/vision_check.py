"""Does a vision family batch exactly as mlx_vlm generates alone? The check behind the vision
rows of the compatibility matrix and the vision tests.

The reference is INDEPENDENT of the engine: mlx_vlm's own `stream_generate` (its generate_step:
embeddings, chunked prefill and decode over the full model), one request at a time, greedy, on
the family's processor outputs. The engine then serves the same requests together: image and
text-only requests in one batch, a request joining while the batch decodes, and one aborted
mid-decode. Every row must give the reference's tokens, token for token.

The requests are generated from a seed (image sizes and aspect ratios, texts), not hand-picked.
Run the reference while no Engine is running (MLX is driven by one thread at a time).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

MAX_TOKENS = 8  # per request; the first batch decodes twice as long, so the late request joins it running


@dataclass
class Case:
    name: str
    messages: list[dict]
    images: list  # PIL images, in the order the template renders them


@dataclass
class FamilyReport:
    architecture: str
    cache_types: list[str]
    checks: dict = field(default_factory=dict)  # check name -> True / False / None (could not run)
    details: dict = field(default_factory=dict)  # check name -> what went wrong
    verdict: str = "untestable"
    reason: str = ""
    notes: list = field(default_factory=list)  # how the family is served, for the reason line

    def entry(self) -> dict:
        return {"architecture": self.architecture, "package": "mlx_vlm", "cache_types": self.cache_types,
                "verdict": self.verdict, "reason": self.reason, "checks": self.checks}


def picture(width: int, height: int, seed: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))


def cases(seed: int = 0) -> list[Case]:
    """One image, two images with a system prompt, text only, a late joiner, an aborted one."""
    rng = random.Random(seed)
    words = ["What", "is", "this", "picture", "describe", "colours", "and", "shapes", "briefly", "now"]

    def image():
        return picture(rng.choice([28, 42, 56, 70, 84]), rng.choice([28, 42, 56, 70]), rng.randrange(1 << 30))

    def text(n):
        return " ".join(rng.choice(words) for _ in range(n))

    def user(*parts):
        return {"role": "user", "content": list(parts)}

    one, two_a, two_b, late, aborted = image(), image(), image(), image(), image()
    return [
        Case("image", [user({"type": "image", "image": one}, {"type": "text", "text": text(4)})], [one]),
        Case("two_images", [{"role": "system", "content": text(3)},
                            user({"type": "text", "text": text(2)}, {"type": "image", "image": two_a},
                                 {"type": "image", "image": two_b})], [two_a, two_b]),
        Case("text_only", [{"role": "user", "content": text(6)}], []),
        Case("late_join", [user({"type": "text", "text": text(3)}, {"type": "image", "image": late})], [late]),
        Case("abort", [user({"type": "image", "image": aborted}, {"type": "text", "text": text(2)})], [aborted]),
    ]


def budget(case: Case) -> int:
    return MAX_TOKENS if case.name == "late_join" else 2 * MAX_TOKENS


def reference(loaded, case: Case, max_tokens: int = MAX_TOKENS) -> tuple[list[int], int]:
    """mlx_vlm's greedy tokens for one chat request alone, and its prompt's token count."""
    from mlx_nb.engine import normalize_messages
    from mlx_nb.engine import render_vision_prompt

    text = render_vision_prompt(loaded, normalize_messages(case.messages))
    return generate_alone(loaded, text, case.images, chat=True, max_tokens=max_tokens)


def generate_alone(loaded, text: str, images: list, *, chat: bool, max_tokens: int = MAX_TOKENS) -> tuple[list[int], int]:
    """mlx_vlm's `stream_generate` over the family's processor outputs, greedy, stop token
    excluded (as the engine reports tokens); also the prompt's token count."""
    import mlx.core as mx
    from mlx_vlm.generate import stream_generate

    if images:
        outputs = dict(loaded.processor(text=[text], images=list(images), return_tensors="mlx"))
        ids = mx.array(outputs.pop("input_ids"))
        pixels = outputs.pop("pixel_values", outputs.pop("images", None))
        mask = outputs.pop("attention_mask", None)
        inputs = {k: v if isinstance(v, (mx.array, list)) or v is None else mx.array(v) for k, v in outputs.items()}
        inputs.update(pixel_values=pixels if pixels is None or isinstance(pixels, (mx.array, list)) else mx.array(pixels),
                      mask=None if mask is None else mx.array(mask))
    else:
        ids = mx.array(loaded.tokenizer.encode(text, add_special_tokens=not chat))[None]
        inputs = {"pixel_values": None, "mask": mx.ones(ids.shape, dtype=mx.int32)}
    lm = loaded.vision_model.language_model
    for attr in ("_position_ids", "_rope_deltas"):  # the previous request's mRoPE state
        if hasattr(lm, attr):
            setattr(lm, attr, None)
    last = None
    for last in stream_generate(loaded.vision_model, loaded.processor, text, input_ids=ids.reshape(1, -1),
                                max_tokens=max_tokens, temperature=0.0, **inputs):
        pass
    tokens = list(last.token_ids or []) if last is not None else []
    eos = set(loaded.tokenizer.eos_token_ids)
    return (tokens[:-1] if tokens and tokens[-1] in eos else tokens), int(ids.size)


def check_family(name: str, *, prefill_step_size: int = 16, seed: int = 0, timeout: float = 300) -> FamilyReport:
    """Reference for every case, then the engine serving them together; fills a FamilyReport."""
    from mlx_vlm.utils import get_model_type

    from mlx_nb.models import load_model
    from mlx_nb.models.cache_types import cache_type_label
    from mlx_nb.models.vision import VisionFamilyRefused

    report = FamilyReport(architecture=name, cache_types=[])
    try:
        loaded = load_model(name)
    except VisionFamilyRefused as exc:  # refused at load, before any request
        report.architecture, report.verdict, report.reason = exc.family, "refused", exc.reason
        report.cache_types = _language_model_caches(name)
        report.checks = {c.name: None for c in cases(seed)}
        return report
    except Exception as exc:
        report.reason = f"does not load: {_line(exc)}"
        return report
    report.architecture = get_model_type(loaded.config)
    report.notes = _how_served(loaded)
    lm_caches = loaded.make_cache()
    report.cache_types = sorted({cache_type_label(c) for c in lm_caches} - {"RopeDeltaCache"})
    all_cases = cases(seed)
    refs: dict[str, Optional[list[int]]] = {}
    lengths: dict[str, int] = {}
    for case in all_cases:
        try:
            refs[case.name], lengths[case.name] = reference(loaded, case, budget(case))
        except Exception as exc:  # mlx_vlm itself cannot serve this request: not a batching question
            refs[case.name] = None
            report.details[case.name] = f"mlx_vlm generate fails: {_line(exc)}"
    report.checks["image_matters"] = _image_matters(loaded, all_cases[0], refs["image"])
    del loaded
    if refs["image"] is None and refs["text_only"] is None:
        report.reason = f"mlx_vlm's own generate fails on it: {report.details.get('image', '')}"
        report.checks = {c.name: None for c in all_cases}
        return report
    served = _serve(name, all_cases, refs, prefill_step_size, timeout)
    _compare(report, all_cases, refs, lengths, served)
    report.checks["outputs_vary"] = len({tuple(t) for t in refs.values() if t}) > 1
    _decide(report)
    if report.verdict == "refused" and served.get("policy") != "sequential":  # one request at a time?
        lane = FamilyReport(report.architecture, report.cache_types, notes=report.notes)
        lane.checks = {k: report.checks[k] for k in _SANITY if k in report.checks}
        lane.details = {k: v for k, v in report.details.items() if refs.get(k, 0) is None}
        _compare(lane, all_cases, refs, lengths,
                 _serve(name, all_cases, refs, prefill_step_size, timeout, mode="sequential"))
        _decide(lane)
        if lane.verdict == "sequential":
            lane.reason = f"{report.reason}; {lane.reason}"
            return lane
    return report


def _compare(report: FamilyReport, all_cases: list[Case], refs: dict, lengths: dict, served: dict) -> None:
    """The engine's answers against mlx_vlm's, case by case, into the report's checks."""
    report.details["policy"] = served.get("policy")
    for case in all_cases:
        got = served.get(case.name)
        if case.name == "abort":
            report.checks["abort"] = got == "abort" if refs[case.name] is not None else None
            if got != "abort" and refs[case.name] is not None:
                report.details["abort"] = f"finished {got!r} instead of 'abort'"
        elif refs[case.name] is None:
            report.checks[case.name] = None
        else:
            report.checks[case.name] = got == refs[case.name]
            if got != refs[case.name]:
                report.details[case.name] = f"engine {got} != mlx_vlm generate {refs[case.name]}"
    wrong = {k: (served.get(f"{k}_prompt_tokens"), n) for k, n in lengths.items()
             if k != "abort" and served.get(f"{k}_prompt_tokens") != n}
    report.checks["prompt_tokens"] = not wrong
    if wrong:
        report.details["prompt_tokens"] = f"usage.prompt_tokens (engine, mlx_vlm): {wrong}"
    sequential = served.get("policy") == "sequential"  # nothing joins: requests wait their turn
    if not sequential and served.get("late_join_batch", 0) < 2 and report.checks.get("late_join"):
        report.checks["late_join"] = False
        report.details["late_join"] = "the late request did not join a running batch"
    if sequential and served.get("late_join_batch", 0) > 1:
        report.checks["late_join"] = False
        report.details["late_join"] = "a request of the sequential lane ran in a batch"


def _serve(name: str, all_cases: list[Case], refs: dict, prefill_step_size: int, timeout: float,
           mode: Optional[str] = None) -> dict:
    """The engine's tokens for every case (the abort case: its finish reason); errors as strings;
    "policy": the batch policy the engine served them with (`mode` forces one)."""
    from mlx_nb import Engine

    by_name = {c.name: c for c in all_cases}
    out: dict[str, Any] = {}
    try:
        with Engine(name, max_batch=8, prefill_step_size=prefill_step_size, wait=True, batch_policy=mode) as engine:
            out["policy"] = engine.status()["policy"]["mode"]
            first = {k: engine.submit(messages=by_name[k].messages, max_tokens=budget(by_name[k]))
                     for k in ("image", "two_images", "text_only", "abort") if refs.get(k) is not None}
            leader = first.get("image") or first.get("text_only")
            next(iter(leader), None)  # the batch is decoding now
            late = engine.submit(messages=by_name["late_join"].messages, max_tokens=budget(by_name["late_join"])) \
                if refs.get("late_join") is not None else None
            if "abort" in first:
                engine.abort(first["abort"].id)
            handles = {**first, **({"late_join": late} if late is not None else {})}
            for key, handle in handles.items():
                r = handle.result(timeout=timeout)
                if key == "abort":
                    out[key] = r.finish_reason
                else:
                    out[key] = r.token_ids if r.error is None else f"error: {r.error}"
                    out[f"{key}_prompt_tokens"] = r.usage.prompt_tokens
            if late is not None:  # the batch size when the late request joined the decode batch
                joined = [e for e in engine.events() if e["kind"] == "extend" and late.id in e["requests"]]
                out["late_join_batch"] = joined[-1]["detail"]["batch_size"] if joined else 0
    except Exception as exc:
        for case in all_cases:
            out.setdefault(case.name, f"error: {_line(exc)}")
    return out


def _image_matters(loaded, case: Case, ref: Optional[list[int]]) -> Optional[bool]:
    """Whether another picture changes the fixture's answer (else an image request proves little)."""
    if ref is None:
        return None
    other = picture(case.images[0].width, case.images[0].height, seed=12345)
    swapped = [{**m, "content": [{"type": "image", "image": other} if p.get("type") == "image" else p
                                 for p in m["content"]]} for m in case.messages]
    return reference(loaded, Case(case.name, swapped, [other]), budget(case))[0] != ref


_SANITY = ("outputs_vary", "image_matters")  # properties of the fixture, not of batching


def _decide(report: FamilyReport) -> None:
    failed = [k for k, v in report.checks.items() if v is False and k not in _SANITY]
    sequential = report.details.get("policy") == "sequential"
    if failed:
        report.verdict = "refused"
        how = "one request at a time" if sequential else "batched"
        report.reason = f"{how} output differs from mlx_vlm generate ({', '.join(failed)}): " + \
            report.details[failed[0]][:160]
    elif not (report.checks.get("outputs_vary") and report.checks.get("image_matters")):
        report.verdict = "untestable"
        report.reason = "the tiny fixture's answers do not depend on the request or the image, so equality proves nothing"
    else:
        skipped = [k for k, v in report.checks.items() if v is None and k not in _SANITY]
        report.verdict = "sequential" if sequential else "batched"
        how = "served one request at a time through mlx_vlm's generate_step" if sequential else \
            "prefilled alone, decoded in the shared batch"
        report.reason = "; ".join([how, *report.notes, "equals mlx_vlm generate"])
        if skipped:
            report.reason += f" (not run: {', '.join(skipped)}: {report.details[skipped[0]][:100]})"


def _language_model_caches(name: str) -> list[str]:
    """The cache types of a family's language model, read through mlx_vlm alone."""
    from mlx_vlm.models.cache import make_prompt_cache
    from mlx_vlm.utils import load

    from mlx_nb.models.cache_types import cache_type_label
    from mlx_nb.models.sources import resolve

    model, _ = load(str(resolve(name)))
    return sorted({cache_type_label(c) for c in make_prompt_cache(model.language_model)})


def _how_served(loaded) -> list[str]:
    from mlx_nb.models.vision import chunked_prefill_allowed

    notes = [loaded.sequential] if loaded.sequential else []
    if loaded.model.rope_deltas:
        notes.append("per-row mRoPE deltas")
    if not chunked_prefill_allowed(loaded.vision_model, input_ids=None, inputs_embeds=None, prompt_cache=None,
                                   prefill_kwargs={}):
        notes.append("prompt read in one pass (it attends both ways)")
    if loaded.model.padding_mask:
        notes.append("batch padding masked for it")
    return notes


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]
