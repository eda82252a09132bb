"""Prompt-lookup speculation, on and off, in one run: editing workloads (the prompt holds code the
answer repeats with a change, as a coding agent's edits do) and a free-text one, at 1 and 32 streams.

    .venv/bin/python bench/speculation.py             # writes bench/results/speculation.{json,md}
    .venv/bin/python bench/speculation.py --report    # the .md again from the .json

The editing cases are generated: functions of 10-30 lines drawn (seeded) from this Python's own
standard library, each with one of its local names to rename, asked the same way as the three
hand-written snippets kept beside them. One stream reads each case alone, one after the other; 32
streams read 32 cases at once.

Two models: the default, which asked for an edit mostly writes other code, and the same model
fine-tuned to make the edit (bench/edit_model.py; it needs llama.cpp's llama-quantize once), whose
answers repeat the code as a coding model's do. Editing and free text on both (the hand-written
snippets on the default only).

Per model, two in-process Engines, one with `speculation=False`, take turns, case by case at one
stream (the box is shared: ratios within one run). Greedy, so both must give the same tokens
(checked). Tokens/s of decoding: from each batch's first token to its last (summed over the cases
read one at a time); medians of REPS.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).parent

import mlx_nb  # noqa: E402,F401  (preloads the fast BLAS before MLX)

MODEL = "smollm2-135m-instruct"
EDIT_MODEL = "smollm2-135m-edit"  # bench/edit_model.py
TOKENS = 200
REPS = 3
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
    from edit_model import functions

    found = functions(sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")), LINES, min_uses=3)
    rng = random.Random(seed)
    rng.shuffle(found)
    return [(where, old, f"new_{old}", code) for where, names, code in found[:n]
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


def run_alone(engines: dict, cases: int, messages, rep: int = 0) -> tuple[dict, dict]:
    """Per engine, decode tokens/s of one stream over `cases` requests read one after the other, and
    their tokens: each case read by every engine in turn, which engine first rotating, so the box's
    drift falls on all of them alike."""
    names = list(engines)
    each = {k: [] for k in names}
    for i in range(cases):
        turn = (i + rep) % len(names)
        for k in names[turn:] + names[:turn]:
            each[k].append(decode([engines[k].submit(messages=messages(i), max_tokens=TOKENS)]))
    return ({k: sum(t for t, _, _ in v) / sum(s for _, s, _ in v) for k, v in each.items()},
            {k: [o[0] for _, _, o in v] for k, v in each.items()})


def copy_runs(context: list[int], answer: list[int], width: int, lookup: bool) -> float:
    """Tokens per verifying step of `width` (the pending token and width - 1 guesses) over `answer`,
    had every step verified: with this project's lookup (`lookup`), or with the best guess any prompt
    lookup could make (the longest run of the answer's next tokens found anywhere before them)."""
    from mlx_nb.engine.speculation.prompt_lookup import propose

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


def ceiling_lines(name: str, model: str, bound: dict) -> list[str]:
    return ["", f"## What {model}'s answers of \"{name}\" allow at one stream", "",
            "Had every step of these answers (one stream, greedy, without speculation) verified a guess of "
            "w - 1 tokens: the tokens a step gives with the latest-occurrence lookup's guesses (without the row's "
            "copy pointer, which the engine's lookup adds), and with the best guess any prompt lookup could make (the longest run of the answer's next tokens found anywhere before them), against "
            "the cost of a forward of w tokens over one (the model alone, after the first prompt).", "",
            "| width w | forward cost | tokens a step: lookup | any copy | speed-up at best: lookup | any copy |",
            "|---|---|---|---|---|---|",
            *[f"| {w} | {r['cost']:.2f}x | {r['lookup_tokens']:.2f} | {r['any_copy_tokens']:.2f} | "
              f"{r['lookup_speedup']:.2f}x | {r['any_copy_speedup']:.2f}x |" for w, r in bound.items()]]


def faithful(tokenizer, messages, answers: list, cases: int) -> float:
    """How much of the answers is the edit asked for: characters in blocks matching the renamed
    code (difflib), over the answers' characters."""
    import difflib

    from edit_model import rename

    matched = total = 0
    for i, answer in enumerate(answers[:cases]):
        old, new, code = EDITS[i % len(EDITS)][1:] if messages is edit_messages else SNIPPETS[i % len(SNIPPETS)]
        text = tokenizer.decode(answer)
        blocks = difflib.SequenceMatcher(None, text, rename(code, old, new), autojunk=False).get_matching_blocks()
        matched += sum(b.size for b in blocks)
        total += len(text)
    return matched / max(total, 1)


def measure(source: str, workloads: dict) -> dict:
    """Both engines of `source` (on and off, interleaved) over `workloads`, REPS times."""
    from mlx_nb import Engine

    engines = {"on": Engine(source, prefix_cache=False, wait=True),
               "off": Engine(source, prefix_cache=False, speculation=False, wait=True)}
    for e in engines.values():
        run(e, 2, snippet_messages)  # warm-up
    rates = {w: {n: {k: [] for k in engines} for n in STREAMS} for w in workloads}
    verifying = {w: {n: [0, 0] for n in STREAMS} for w in workloads}  # the on engine's verifying steps, steps
    alone = {}  # workload -> the one-stream answers without speculation (the last rep's)
    same = True
    for rep in range(REPS):
        for w, (messages, cases) in workloads.items():
            for n in STREAMS:
                before = engines["on"].status()["speculation"]
                if n == 1:  # case by case, the engines in turn (the first alternating): the box drifts
                    rate, outputs = run_alone(engines, cases, messages, rep)
                else:
                    rate, outputs = {}, {}
                    for k in list(engines)[rep % 2:] + list(engines)[:rep % 2]:  # which goes first alternates
                        rate[k], outputs[k] = run(engines[k], n, messages)
                for k in engines:
                    rates[w][n][k].append(rate[k])
                after = engines["on"].status()["speculation"]
                verifying[w][n][0] += after["speculative_steps"] - before["speculative_steps"]
                verifying[w][n][1] += after["steps"] - before["steps"]
                same &= outputs["on"] == outputs["off"]
                if n == 1:
                    alone[w] = outputs["off"]
    editing = [w for w in workloads if w.startswith("editing")]
    tokenizer = engines["off"].loaded.tokenizer
    out = {"identical_outputs": same, "runs": rates, "verifying_steps": verifying,
           "speculation": engines["on"].status()["speculation"],
           "faithful": {w: faithful(tokenizer, workloads[w][0], alone[w], workloads[w][1]) for w in editing},
           "ceilings": {w: ceiling(engines["off"], workloads[w][0], alone[w]) for w in editing}}
    for e in engines.values():
        e.close()
    out["median_tokens_per_s"] = {w: {n: {k: statistics.median(v) for k, v in by.items()} for n, by in ns.items()}
                                  for w, ns in rates.items()}
    return out


def table(r: dict) -> list[str]:
    lines = ["| workload | streams | off | on | on / off | verifying steps (on) |", "|---|---|---|---|---|---|"]
    for w, ns in r["median_tokens_per_s"].items():
        for n, m in ns.items():
            v, steps = r["verifying_steps"][w][n]
            lines.append(f"| {w} | {n} | {m['off']:.1f} | {m['on']:.1f} | **{m['on'] / m['off']:.2f}x** | "
                         f"{v} of {steps} |")
    spec = r["speculation"]
    return lines + ["", f"Over the run: {spec['proposed_tokens']} tokens proposed, {spec['accepted_tokens']} accepted "
                    f"({spec['acceptance']}), in {spec['speculative_steps']} of {spec['steps']} decode steps. "
                    "How much of the one-stream answers is the edit asked for (characters matching the renamed "
                    "code): " + ", ".join(f"{w} {f:.0%}" for w, f in r["faithful"].items()) + "."]


def main() -> int:
    from edit_model import edit_model

    if sys.argv[1:] == ["--report"]:  # the page again from the last run's numbers
        write_report(json.loads((HERE / "results" / "speculation.json").read_text()))
        return 0
    editor = str(edit_model())
    results = {MODEL: measure(MODEL, WORKLOADS),
               EDIT_MODEL: measure(editor, {w: WORKLOADS[w] for w in ("editing", "free text")})}
    same = all(r["identical_outputs"] for r in results.values())
    out = {"tokens": TOKENS, "reps": REPS, "identical_outputs": same, "models": results,
           "editing_cases": {"seed": SEED, "lines": LINES, "python": sys.version.split()[0],
                             "cases": [f"{where}: {old} -> {new}" for where, old, new, _ in EDITS]}}
    (HERE / "results" / "speculation.json").write_text(json.dumps(out, indent=2))
    write_report(json.loads(json.dumps(out)))
    return 0 if same else 1


def write_report(out: dict) -> None:
    """speculation.md from speculation.json's numbers."""
    results = out["models"]
    lines = ["# Prompt-lookup speculation in the shared batch", "",
             f"Greedy, {out['tokens']} tokens a row, median of {out['reps']} (on and off interleaved, two in-process "
             "engines of each model). Decode tokens/s: one stream over each workload's cases read one after the "
             "other, 32 streams over 32 of them at once. Outputs with and without speculation identical: "
             f"**{'yes' if out['identical_outputs'] else 'NO'}**.", "",
             f"- **editing**: {len(EDITS)} functions of {LINES[0]}-{LINES[1]} lines drawn from Python "
             f"{out['editing_cases']['python']}'s standard library (its top-level modules; seed {SEED}; listed in "
             "speculation.json), each asked to be rewritten exactly with one of its names renamed.",
             f"- **editing, hand-written**: the same request on {len(SNIPPETS)} short snippets written for this bench.",
             f"- **free text**: short essays on {len(TOPICS)} topics.", "",
             f"## {MODEL} (the default model)", "",
             "Asked for an edit, it mostly writes other code (the line under the table says how much of its "
             "answers is the edit asked for), so its answers repeat their prompt only in part.", "",
             *table(results[MODEL]), "",
             f"## {EDIT_MODEL}: the same model, fine-tuned to make the edit", "",
             "The default model's own weights with a LoRA trained here on rename edits of functions from the "
             "standard library's packages (none of the cases above), fused, and quantized to Q4_K_M by "
             "llama-quantize (`bench/edit_model.py`): a model that repeats the code it edits, as coding models do, "
             "at the default model's size (105 MB against 98) and cost a step, loaded from its GGUF as a user's "
             "would be.", "", *table(results[EDIT_MODEL])]
    for name, r in results.items():
        for w, bound in r["ceilings"].items():
            lines += ceiling_lines(w, name, bound)
    (HERE / "results" / "speculation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
