"""The checks behind one architecture's verdict, on a tiny model directory.

Eight prompts (most longer than the tiny sliding windows and conv kernels, one a single token, two of
equal length) run ALONE through the
independent reference (mlx_lm's `generate_step`, greedy), then TOGETHER through mlx_nb's Engine:
five at once, three more once those decode (late joiners), plus one request aborted mid-decode
that must leave the others unchanged. Then a second chat turn that reuses the first turn's cache
(warm) must equal the reference for the same tokens (cold). Each engine run forces a batch policy
(`Engine(batch_policy=...)`): prompts prefilled together, or one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from mlx_nb.compat.reference import reply_tokens
from mlx_nb.compat.upstream import attribute
from mlx_nb.engine import unmergeable as cannot_merge
from mlx_nb.engine import first_line

MAX_TOKENS = 8
PROMPTS = [  # lengths 34, 3, 61, 1, 34 (submitted together), then 12, 45, 20 (late): byte tokens
    "The quick brown fox jumps over it.",
    "Hi!",
    "Once upon a time, in a land of rivers and hills, a clock said.",
    "A",  # one token: nothing to prefill before the first step
    "The slow green cat naps under me.",  # as long as the first: rows with no padding at all
    "Count: 1 2 3",
    "Describe the colour of the sea at dawn, please",
    "Why is the sky blue?",
]
FIRST = 5
VICTIM = "A request that is aborted while it decodes."
SYSTEM = "You answer in one short line."
TURN1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour of the sky."}]
FOLLOW_UP = {"role": "user", "content": "And at night?"}
UNTESTED = {  # the stage that failed -> what it means
    "build": "no tiny instance can be built",
    "load": "the tiny instance does not load",
    "alone": "the tiny instance fails alone (in generate_step)",
    "reference": "the tiny instance fails alone (in generate_step)",
}
ENGINE_OPTIONS = dict(prefill_step_size=16, prefill_budget_s=None, max_batch=16)  # deterministic chunks


@dataclass
class Expected:
    """The reference's tokens, computed before any engine runs (one MLX thread at a time)."""

    prompts: list[list[int]]
    rows: list[list[int]]
    turn1: list[int]
    turn2_messages: list[dict]
    turn2: list[int]


@dataclass
class Run:
    """One engine run in one batch policy: which checks passed, and what went wrong."""

    checks: dict = field(default_factory=dict)
    differs: list[int] = field(default_factory=list)  # rows that differ from the reference
    error: Optional[str] = None
    cached_tokens: Optional[int] = None
    policy: Optional[dict] = None  # what Engine.status() said

    @property
    def ok(self) -> bool:
        return all(self.checks.get(c) for c in ("batched", "late_join", "abort")) and self.checks.get("prefix") is not False

    @property
    def sequential_ok(self) -> bool:
        return bool(self.checks.get("batched") and self.checks.get("abort"))


def chat_tokens(loaded, messages: list[dict]) -> list[int]:
    from mlx_nb.engine import normalize_messages
    from mlx_nb.engine import encode_prompt, render_chat

    return encode_prompt(loaded.tokenizer, render_chat(loaded.tokenizer, normalize_messages(messages)), chat=True)


def expected(loaded) -> Expected:
    from mlx_nb.engine import encode_prompt

    prompts = [encode_prompt(loaded.tokenizer, p, chat=False) for p in PROMPTS]
    rows = [reply_tokens(loaded, p, MAX_TOKENS) for p in prompts]
    turn1 = reply_tokens(loaded, chat_tokens(loaded, TURN1), MAX_TOKENS)
    answer = {"role": "assistant", "content": loaded.tokenizer.decode(turn1)}
    turn2_messages = [*TURN1, answer, FOLLOW_UP]
    turn2 = reply_tokens(loaded, chat_tokens(loaded, turn2_messages), MAX_TOKENS)
    return Expected(prompts, rows, turn1, turn2_messages, turn2)


def run_engine(path: str, mode: Optional[str], want: Expected, timeout: float = 300.0) -> Run:
    """The batch scenario and the prefix scenario, each on a fresh Engine forced into `mode`
    (None: the policy the engine itself decides from the matrix)."""
    from mlx_nb import Engine

    run = Run()
    try:
        with Engine(path, batch_policy=mode, prefix_cache=False, wait=True, **ENGINE_OPTIONS) as engine:
            run.policy = engine.status()["policy"]
            (_queued if run.policy["mode"] == "sequential" else _together)(engine, want, run, timeout)
        with Engine(path, batch_policy=mode, prefix_cache=True, wait=True, **ENGINE_OPTIONS) as engine:
            _prefix(engine, want, run, timeout)
    except Exception as exc:  # a load or step failure: the run fails with its one-line reason
        run.error = run.error or f"{type(exc).__name__}: {first_line(exc)}"
    for name in ("batched", "late_join", "abort", "prefix"):
        run.checks.setdefault(name, False if run.error else None)
    return run


def _together(engine, want: Expected, run: Run, timeout: float) -> None:
    eos = engine.loaded.tokenizer.eos_token_ids
    first = [engine.submit(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS[:FIRST]]
    # The victim never stops by itself (its end-of-sequence logit is pushed down), so the abort
    # always lands mid-decode.
    victim = engine.submit(prompt=VICTIM, max_tokens=64, logit_bias={t: -100 for t in eos})
    _wait_decoding(victim, timeout)
    late = [engine.submit(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS[FIRST:]]
    _wait_decoding(late[0], timeout)
    victim.abort()
    errors = _collect(first + late, victim, want, run, timeout)
    run.checks["batched"] = not errors and not run.differs
    late_ids = {h.id for h in late}
    joined = [e for e in engine.events() if e["kind"] == "extend" and set(e["requests"]) & late_ids]
    run.checks["late_join"] = (not errors and bool(joined) and all(e["detail"]["batch_size"] >= 2 for e in joined)
                               and not [i for i in run.differs if i >= FIRST])


def _queued(engine, want: Expected, run: Run, timeout: float) -> None:
    """The sequential lane's scenario: every prompt submitted at once waits its turn and equals the
    reference; the victim, aborted while it decodes, ends so and the queue goes on."""
    eos = engine.loaded.tokenizer.eos_token_ids
    first = [engine.submit(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS[:FIRST]]
    victim = engine.submit(prompt=VICTIM, max_tokens=64, logit_bias={t: -100 for t in eos})
    late = [engine.submit(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS[FIRST:]]
    _wait_decoding(victim, timeout)
    victim.abort()
    errors = _collect(first + late, victim, want, run, timeout)
    one_at_a_time = all(e["detail"].get("batch_size", 1) <= 1 for e in engine.events() if e["kind"] == "step")
    run.checks["batched"] = not errors and not run.differs and one_at_a_time
    run.checks["late_join"] = None  # nothing joins: requests wait their turn


def _collect(handles: list, victim, want: Expected, run: Run, timeout: float) -> list[str]:
    """Every result: the rows that differ from the reference, the abort check, the errors."""
    results = [h.result(timeout=timeout) for h in handles]
    gone = victim.result(timeout=timeout)
    errors = [r.error for r in results + [gone] if r.error]
    if errors:
        run.error = errors[0]
    run.differs = [i for i, (r, ref) in enumerate(zip(results, want.rows)) if r.token_ids != ref]
    run.checks["abort"] = gone.finish_reason == "abort" and not errors
    return errors


def _wait_decoding(handle, timeout: float) -> None:
    """Return once `handle` streamed a token (or finished)."""
    import threading

    seen = threading.Event()

    def read():
        for _ in handle:
            seen.set()
            return
        seen.set()

    threading.Thread(target=read, daemon=True).start()
    if not seen.wait(timeout):
        raise TimeoutError(f"no token within {timeout:.0f} s")


def _prefix(engine, want: Expected, run: Run, timeout: float) -> None:
    one = engine.submit(messages=TURN1, max_tokens=MAX_TOKENS).result(timeout=timeout)
    two = engine.submit(messages=want.turn2_messages, max_tokens=MAX_TOKENS).result(timeout=timeout)
    if one.error or two.error:
        run.error = run.error or one.error or two.error
        run.checks["prefix"] = False
        return
    run.cached_tokens = two.usage.cached_tokens
    if one.token_ids != want.turn1:
        run.checks["prefix"] = False
    elif two.usage.cached_tokens == 0:
        run.checks["prefix"] = None  # nothing reusable: not applicable
    else:
        run.checks["prefix"] = two.token_ids == want.turn2


def measure(path: str, note: Callable[[str, dict], None] = lambda stage, entry: None,
            batched_failed: Optional[str] = None, alone_failed: Optional[str] = None) -> dict:
    """The matrix entry (without its name) for the model at `path`: cache types, checks, verdict.

    `note(stage, entry)` is called before each stage with the entry so far, so a caller running
    this in a subprocess knows where a crash or a hang happened. `batched_failed` (why) skips the
    batched run, known to crash or hang, and goes straight to prompts prefilled one at a time;
    `alone_failed` (why) skips that run too, straight to the sequential lane.
    """
    from mlx_nb.models import load_model

    entry: dict = {"cache_types": [], "checks": {"build": False}, "details": {}}
    note("load", entry)
    try:
        loaded = load_model(path)
        entry["cache_types"] = loaded.cache_types()
    except Exception as exc:
        entry["details"]["error"] = f"load: {type(exc).__name__}: {first_line(exc)}"
        return finish(entry)
    entry["checks"]["build"] = True
    unmergeable = cannot_merge(loaded.make_cache())
    note("reference", entry)
    try:
        want = expected(loaded)
    except Exception as exc:
        entry["checks"]["reference"] = False
        entry["details"]["error"] = f"alone: {type(exc).__name__}: {first_line(exc)}"
        return finish(entry)
    del loaded
    entry["checks"]["reference"] = True
    note("batched", entry)
    if unmergeable:  # refused at load by the engine whatever the policy: nothing to run batched
        entry["details"]["unmergeable"] = unmergeable
        batched_failed = f"{unmergeable} caches cannot be merged"
    if batched_failed:
        batched = Run(error=batched_failed)
        batched.checks = dict.fromkeys(("batched", "late_join", "abort", "prefix"), False)
    else:
        batched = run_engine(path, "batched", want)
    entry["checks"].update(batched.checks)
    _describe(entry["details"], "batched", batched)
    if not batched.ok:
        note("prefill_alone", entry)
        if alone_failed:
            alone = Run(error=alone_failed)
            alone.checks = dict.fromkeys(("batched", "late_join", "abort", "prefix"), False)
        else:
            alone = batched if unmergeable else run_engine(path, "prefill_alone", want)
        entry["checks"]["prefill_alone"] = alone.ok
        _describe(entry["details"], "prefill_alone", alone)
        if not alone.ok:  # one request at a time, through generate_step (engine/scheduling/sequential.py)
            note("sequential", entry)
            lane = run_engine(path, "sequential", want)
            entry["checks"]["sequential"] = lane.sequential_ok
            _describe(entry["details"], "sequential", lane)
        note("upstream", entry)
        runs = ("together",) if alone.ok or unmergeable else ("together", "alone", "alone_whole")
        entry["details"]["upstream"] = attribute(load_model(path), want.prompts, want.rows, MAX_TOKENS,
                                                 ENGINE_OPTIONS["prefill_step_size"], runs)
    return finish(entry)


def _describe(details: dict, mode: str, run: Run) -> None:
    info = {"rows_differ": run.differs, "error": run.error, "cached_tokens": run.cached_tokens,
            "failed": sorted(k for k, v in run.checks.items() if v is False)}
    details[mode] = {k: v for k, v in info.items() if v not in (None, [])}


def finish(entry: dict) -> dict:
    """Every check named (null when not run), then the verdict and its reason."""
    from mlx_nb.compat.matrix import CHECKS, verdict_of

    checks = {name: entry["checks"].get(name) for name in CHECKS}
    verdict = verdict_of(checks)
    done = {"cache_types": entry["cache_types"], "verdict": verdict, "reason": "", "checks": checks,
            "details": entry["details"]}
    done["reason"] = reason(done)
    return done


def reason(entry: dict) -> str:
    """One line: why this verdict, from the checks and details."""
    d, verdict = entry["details"], entry["verdict"]
    if verdict == "untested":
        stage, _, error = d.get("error", "unknown: unknown error").partition(": ")
        return f"{UNTESTED.get(stage, stage)}: {error}"
    if verdict == "batched":
        reuse = "" if entry["checks"].get("prefix") else "; no prefix reuse to check"
        return f"batched output equals generate_step alone for every row{reuse}"
    up = d.get("upstream", {})
    together, alone = d.get("batched", {}), d.get("prefill_alone", {})
    if verdict == "prefill_alone":
        return f"{_what_failed(together)} when prompts are prefilled together{_same(up.get('together'))}; " \
               "correct when each is prefilled alone"
    if d.get("unmergeable"):
        refuses = " (mlx_lm's own BatchGenerator refuses them too)" if isinstance(up.get("together"), str) else ""
        why = f"its {d['unmergeable']} caches cannot be merged into a batch{refuses}"
    elif alone.get("error") or alone.get("rows_differ"):  # wrong even with prompts prefilled alone
        whole = up.get("alone_whole")
        where = (", in batched decoding" if whole else ", only when read in chunks") \
            if isinstance(whole, list) else ""
        why = f"{_what_failed(alone)} even with prompts prefilled one at a time{where}{_same(up.get('alone'))}"
    else:
        why = f"{_what_failed(together)} when batched, and {_what_failed(alone)} when prefilled alone"
    if verdict == "sequential":
        return f"{why}; one request at a time it equals generate_step for every row"
    return f"{why}; one request at a time too: {_what_failed(d.get('sequential', {}))}"


SEVERITY = ("batched", "prefill_alone", "sequential", "refused")  # combined: the most careful one


def combine(instances: dict[str, dict]) -> dict:
    """One architecture's entry from its instances' entries (name -> entry): the verdict every
    instance allows (batched only if all are), with that instance's checks and details, and every
    instance's verdict listed. Instances that could not run count only when none could."""
    ran = {n: e for n, e in instances.items() if e["verdict"] not in ("untested", "untestable")}
    if not ran:
        first = next(iter(instances.values()))
        return {**first, "instances": _listed(instances)}
    worst_name = max(ran, key=lambda n: SEVERITY.index(ran[n]["verdict"]))
    worst = ran[worst_name]
    disagree = any(e["verdict"] != worst["verdict"] for e in ran.values())
    reason = f"{worst['reason']} (on {worst_name}; {instance_counts(instances)})" if disagree else worst["reason"]
    return {**worst, "reason": reason, "instances": _listed(instances)}


def instance_counts(instances) -> str:
    """'3 batched, 1 prefill_alone of 4 instances' from a name -> entry dict or an entry's list."""
    verdicts = [e["verdict"] for e in (instances.values() if isinstance(instances, dict) else instances)]
    seen = [v for v in (*SEVERITY, "untested", "untestable") if v in verdicts]
    return ", ".join(f"{verdicts.count(v)} {v}" for v in seen) + f" of {len(verdicts)} instances"


def _listed(instances: dict[str, dict]) -> list[dict]:
    return [{"instance": n, "verdict": e["verdict"], "reason": e["reason"]} for n, e in instances.items()]


def _same(upstream) -> str:
    """Whether mlx_lm's own BatchGenerator shows the same: then the cause is upstream, not mlx_nb."""
    if isinstance(upstream, list):
        return f" (so does mlx_lm's own BatchGenerator: {_rows(len(upstream))})" if upstream else \
            " (mlx_lm's own BatchGenerator does not)"
    return " (so does mlx_lm's own BatchGenerator)" if upstream else ""


def _what_failed(run: dict) -> str:
    if run.get("error"):
        return f"fails ({run['error'].removeprefix('batch step failed: ')})"
    if run.get("rows_differ"):
        n = len(run["rows_differ"])
        return f"{n} of {_rows(len(PROMPTS))} {'differs' if n == 1 else 'differ'} from generate_step"
    if "prefix" in run.get("failed", []):
        return "a turn reusing the prefix cache differs from a cold run"
    return f"checks {', '.join(run.get('failed', [])) or 'none'} fail"


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"
