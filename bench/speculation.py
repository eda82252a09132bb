"""Prompt-lookup speculation, on and off, in one run: editing workloads (the prompt holds code the
answer repeats with a change, as a coding agent's edits do) and a free-text one, at 1 and 32 streams.

    .venv/bin/python bench/speculation.py    # writes bench/results/speculation.{json,md}

The editing cases are generated: functions of 10-30 lines drawn (seeded) from this Python's own
standard library, each with one of its local names to rename, asked the same way as the three
hand-written snippets kept beside them. One stream reads each case alone, one after the other; 32
streams read 32 cases at once.

Two in-process Engines of the same model, one with `speculation=False`, take turns (the box is
shared: ratios within one run). Greedy, so both must give the same tokens (checked). Tokens/s of
decoding: from each batch's first token to its last (summed over the cases read one at a time);
medians of REPS.
"""

from __future__ import annotations

import ast
import builtins
import json
import random
import statistics
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).parent

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

MODEL = "smollm2-135m-instruct"
TOKENS = 200
REPS = 5
STREAMS = (1, 32)
CASES = 32  # generated editing cases
SEED = 0
LINES = (10, 30)  # a drawn function's length

SNIPPETS = [
    ("total", "grand_total", '''def summarize(records):
    total = 0
    count = 0
    for record in records:
        if record.get("valid"):
            total += record["amount"]
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}
'''),
    ("items", "entries", '''class Basket:
    def __init__(self):
        self.items = []

    def add(self, name, price, quantity=1):
        self.items.append({"name": name, "price": price, "quantity": quantity})

    def total(self):
        return sum(item["price"] * item["quantity"] for item in self.items)

    def names(self):
        return [item["name"] for item in self.items]
'''),
    ("path", "source", '''def read_config(path):
    with open(path) as handle:
        lines = handle.read().splitlines()
    config = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        config[key.strip()] = value.strip()
    return config
'''),
]
TOPICS = ["a lighthouse keeper who finds a message in a bottle", "the history of the bicycle",
          "why the sky is blue, for a child", "a recipe for bread, step by step"]


def stdlib_edits(n: int = CASES, seed: int = SEED) -> list[tuple[str, str, str, str]]:
    """n (where, old name, new name, code): functions of LINES lines from the standard library's
    top-level modules, in a seeded order, each with one of its arguments or locals that it uses at
    least 3 times (not self, not a builtin's name) to rename."""
    functions = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not LINES[0] <= node.end_lineno - node.lineno + 1 <= LINES[1]:
                continue
            uses: dict[str, int] = {}
            local = set()  # arguments and names assigned in the function
            for sub in ast.walk(node):
                name = sub.id if isinstance(sub, ast.Name) else sub.arg if isinstance(sub, ast.arg) else None
                if name is not None:
                    uses[name] = uses.get(name, 0) + 1
                    if isinstance(sub, ast.arg) or isinstance(sub.ctx, ast.Store):
                        local.add(name)
            names = sorted(k for k in local if uses[k] >= 3 and len(k) > 1 and k != "self"
                           and not k.startswith("__") and not hasattr(builtins, k))
            if names:
                code = textwrap.dedent(ast.get_source_segment(source, node)) + "\n"
                functions.append((f"{path.stem}.{node.name}", names, code))
    rng = random.Random(seed)
    rng.shuffle(functions)
    return [(where, old, f"new_{old}", code) for where, names, code in functions[:n]
            for old in [rng.choice(names)]]


EDITS = stdlib_edits()


def rename_messages(old: str, new: str, code: str) -> list:
    return [{"role": "user", "content": f"{code}\nRewrite the code above exactly as it is, but rename `{old}` to "
                                        f"`{new}` everywhere. Reply with the code only."}]


def edit_messages(i: int) -> list:
    return rename_messages(*EDITS[i % len(EDITS)][1:])


def snippet_messages(i: int) -> list:
    return rename_messages(*SNIPPETS[i % len(SNIPPETS)])


def free_messages(i: int) -> list:
    return [{"role": "user", "content": f"Write a short essay about {TOPICS[i % len(TOPICS)]}."}]


# name -> (messages, cases: how many the one-stream runs read one after the other)
WORKLOADS = {"editing": (edit_messages, len(EDITS)), "editing, hand-written": (snippet_messages, len(SNIPPETS)),
             "free text": (free_messages, len(TOPICS))}


def decode(handles: list) -> tuple[int, float, list]:
    """(tokens after the first, seconds from the first to the last, each handle's tokens)."""
    next(iter(handles[0]))
    first = time.perf_counter()
    results = [h.result(timeout=1200) for h in handles]
    spent = time.perf_counter() - first
    return sum(r.usage.completion_tokens for r in results) - 1, spent, [r.token_ids for r in results]


def run(engine, streams: int, messages) -> tuple[float, list]:
    """Decode tokens/s of `streams` rows at once (row i asks messages(i)), and their tokens."""
    tokens, spent, outputs = decode([engine.submit(messages=messages(i), max_tokens=TOKENS) for i in range(streams)])
    return tokens / spent, outputs


def run_alone(engine, cases: int, messages) -> tuple[float, list]:
    """Decode tokens/s of one stream over `cases` requests read one after the other, and their tokens."""
    each = [decode([engine.submit(messages=messages(i), max_tokens=TOKENS)]) for i in range(cases)]
    return sum(t for t, _, _ in each) / sum(s for _, s, _ in each), [o[0] for _, _, o in each]


def copy_runs(context: list[int], answer: list[int], width: int, lookup: bool) -> float:
    """Tokens per verifying step of `width` (the pending token and width - 1 guesses) over `answer`,
    had every step verified: with this project's lookup (`lookup`), or with the best guess any prompt
    lookup could make (the longest run of the answer's next tokens found anywhere before them)."""
    from mlx_nb.engine.speculation import propose

    i = steps = 0
    while i < len(answer):
        seen = context + answer[:i]
        if lookup:
            guess = propose(seen, width)
            run = next((m for m, (a, b) in enumerate(zip(guess, answer[i:])) if a != b), min(len(guess), len(answer) - i))
        else:
            run = 0
            for start in range(len(seen)):
                m = 0
                while m < width and i + m < len(answer) and start + m < len(seen) and seen[start + m] == answer[i + m]:
                    m += 1
                run = max(run, m)
        i += max(1, run)
        steps += 1
    return len(answer) / steps


def forward_costs(engine, context: list[int], widths) -> dict:
    """Seconds of one forward of w tokens after `context`, over one of 1 token (min of 7), the model
    alone: what a verifying step of width w costs against a plain step."""
    import mlx.core as mx

    loaded = engine.loaded
    cache = loaded.make_cache()
    mx.eval(loaded.model(mx.array([context]), cache=cache))
    times = {}
    for w in (1, *widths):
        best = float("inf")
        for _ in range(7):
            start = time.perf_counter()
            mx.eval(loaded.model(mx.array([context[-w:]]), cache=cache))
            best = min(best, time.perf_counter() - start)
            for c in cache:
                c.trim(w)
        times[w] = best
    return {w: times[w] / times[1] for w in widths}


def ceiling(engine, messages, answers: list, widths=range(2, 10)) -> dict:
    """What prompt lookup could gain on these answers (answers[i] to messages(i)) at one stream, at
    best: tokens a verifying step gives (this lookup's guesses; any copy's; over all the answers' steps)
    over the step's cost, for each width."""
    tok = engine.loaded.tokenizer
    contexts = [tok.apply_chat_template(messages(i), add_generation_prompt=True, tokenize=True)
                for i in range(len(answers))]
    cost = forward_costs(engine, contexts[0], widths)
    total = sum(len(a) for a in answers)
    rows = {}
    for w in widths:
        mine = total / sum(len(a) / copy_runs(c, a, w, True) for c, a in zip(contexts, answers))
        best = total / sum(len(a) / copy_runs(c, a, w, False) for c, a in zip(contexts, answers))
        rows[w] = {"cost": cost[w], "lookup_tokens": mine, "any_copy_tokens": best,
                   "lookup_speedup": mine / cost[w], "any_copy_speedup": best / cost[w]}
    return rows


def ceiling_lines(name: str, bound: dict) -> list[str]:
    return ["", f"## What the answers of \"{name}\" allow at one stream", "",
            "Had every step of these answers (one stream, greedy, without speculation) verified a guess of "
            "w - 1 tokens: the tokens a step gives with this lookup's guesses, and with the best guess any prompt "
            "lookup could make (the longest run of the answer's next tokens found anywhere before them), against "
            "the cost of a forward of w tokens over one (the model alone, after the first prompt).", "",
            "| width w | forward cost | tokens a step: lookup | any copy | speed-up at best: lookup | any copy |",
            "|---|---|---|---|---|---|",
            *[f"| {w} | {r['cost']:.2f}x | {r['lookup_tokens']:.2f} | {r['any_copy_tokens']:.2f} | "
              f"{r['lookup_speedup']:.2f}x | {r['any_copy_speedup']:.2f}x |" for w, r in bound.items()]]


def main() -> int:
    from mlx_nb import Engine

    engines = {"on": Engine(MODEL, prefix_cache=False, wait=True),
               "off": Engine(MODEL, prefix_cache=False, speculation=False, wait=True)}
    for e in engines.values():
        run(e, 2, snippet_messages)  # warm-up
    rates = {w: {n: {k: [] for k in engines} for n in STREAMS} for w in WORKLOADS}
    verifying = {w: {n: [0, 0] for n in STREAMS} for w in WORKLOADS}  # the on engine's verifying steps, steps
    alone = {}  # workload -> the one-stream answers without speculation (the last rep's)
    same = True
    for _ in range(REPS):
        for w, (messages, cases) in WORKLOADS.items():
            for n in STREAMS:
                outputs = {}
                for k, e in engines.items():
                    before = e.status()["speculation"]
                    rate, outputs[k] = run_alone(e, cases, messages) if n == 1 else run(e, n, messages)
                    rates[w][n][k].append(rate)
                    if before is not None:
                        after = e.status()["speculation"]
                        verifying[w][n][0] += after["speculative_steps"] - before["speculative_steps"]
                        verifying[w][n][1] += after["steps"] - before["steps"]
                same &= outputs["on"] == outputs["off"]
                if n == 1:
                    alone[w] = outputs["off"]
    spec = engines["on"].status()["speculation"]
    bounds = {w: ceiling(engines["off"], WORKLOADS[w][0], alone[w]) for w in WORKLOADS if w.startswith("editing")}
    for e in engines.values():
        e.close()
    med = {w: {n: {k: statistics.median(v) for k, v in by.items()} for n, by in ns.items()} for w, ns in rates.items()}
    out = {"model": MODEL, "tokens": TOKENS, "reps": REPS, "identical_outputs": same, "median_tokens_per_s": med,
           "runs": rates, "verifying_steps": verifying, "speculation": spec, "ceilings": bounds,
           "editing_cases": {"seed": SEED, "lines": LINES, "python": sys.version.split()[0],
                             "cases": [f"{where}: {old} -> {new}" for where, old, new, _ in EDITS]}}
    results = HERE / "results"
    (results / "speculation.json").write_text(json.dumps(out, indent=2))
    lines = ["# Prompt-lookup speculation in the shared batch", "",
             f"{MODEL}, greedy, {TOKENS} tokens a row, median of {REPS} (on and off interleaved). Decode tokens/s: "
             "one stream over each workload's cases read one after the other, 32 streams over 32 of them at once. "
             "Outputs with and without speculation identical: "
             f"**{'yes' if same else 'NO'}**.", "",
             f"- **editing**: {len(EDITS)} functions of {LINES[0]}-{LINES[1]} lines drawn from Python "
             f"{sys.version.split()[0]}'s standard library (seed {SEED}; listed in speculation.json), each asked to "
             "be rewritten exactly with one of its names renamed.",
             f"- **editing, hand-written**: the same request on {len(SNIPPETS)} short snippets written for this bench.",
             f"- **free text**: short essays on {len(TOPICS)} topics.", "",
             "| workload | streams | off | on | on / off | verifying steps (on) |", "|---|---|---|---|---|---|"]
    for w, ns in med.items():
        for n, r in ns.items():
            v, steps = verifying[w][n]
            lines.append(f"| {w} | {n} | {r['off']:.1f} | {r['on']:.1f} | **{r['on'] / r['off']:.2f}x** | "
                         f"{v} of {steps} |")
    lines += ["", f"Over the run: {spec['proposed_tokens']} tokens proposed, {spec['accepted_tokens']} accepted "
              f"({spec['acceptance']}), in {spec['speculative_steps']} of {spec['steps']} decode steps."]
    for w, bound in bounds.items():
        lines += ceiling_lines(w, bound)
    (results / "speculation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
