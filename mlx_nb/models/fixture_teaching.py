"""Thinking fixtures that think: taught, when they are built, to give one known reply.

A random-weight model never writes a reasoning block of its own, so the routes' handling of one
(reasoning apart from the answer, a budget that closes it, a schema held by the answer) could only
be tested on text forced into it. The two thinking fixtures are instead trained at build time (a
few dozen to a few hundred Adam steps on the tiny model, seconds on a CPU) to answer any question with
`REASONING` then `ANSWER`, in their family's own markers (and with `ANSWER` alone when thinking is
turned off); training stops once greedy decoding gives that reply for held-out questions, each
token at 0.9 or better, so the fixture is known to behave (sampled too) before anyone uses it.
Tests then check exact text: the reasoning, the answer, the first N reasoning tokens a budget keeps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

REASONING = "Two and two make four, so: four."
ANSWER = "Four."

# each family's reply after its generation prompt, as the model writes it
REPLIES = {
    "think": f"{REASONING}\n</think>\n\n{ANSWER}<|im_end|>",  # the prompt opened <think>
    "harmony": (f"<|channel|>analysis<|message|>{REASONING}<|end|>"
                f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"),
}
# the reply with thinking turned off (`enable_thinking=False`: the prompt closed an empty block), for
# the families whose template can turn it off; a quarter of the questions are asked that way
REPLIES_OFF = {"think": f"{ANSWER}<|im_end|>"}
OFF_EVERY = 4

_WORDS = ("what is two plus hello tell me a story count to ten and three the capital of France name "
          "a colour sea why how many days week cat dog sum number please quickly respond with one valid "
          "JSON object nothing else no prose markdown code must conform this schema: {\"type\": "
          "\"properties\": [1, 2] you are helpful assistant tools call").split()
# Checked every 5 steps: a failing check is usually one forward pass of one question, a small part
# of a step, and training is not monotone (a reply held at step 100 may be lost by 105), so checking
# often stops it sooner: 50 and 105 steps for the two fixtures (about 5-10 s each on two cores).
# Four questions a step: two a step learn in half the time, but their replies sampled at temperature
# 1 stray from the taught path (a schema test then finds no answer in 160 tokens); so do replies
# whose tokens are at only even odds (SURE 0.5: 70 steps instead of 105).
STEPS_MAX, BATCH, POOL, CHECK_EVERY, LEARNING_RATE, SURE = 800, 4, 128, 5, 1e-2, 0.9
# what a built fixture depends on (its cache fingerprint)
TRAINING = (STEPS_MAX, BATCH, POOL, CHECK_EVERY, LEARNING_RATE, SURE, OFF_EVERY, tuple(REPLIES_OFF.items()))
# questions it never trained on, with and without a system message (a route may add one)
HELD_OUT = (
    [{"role": "user", "content": "What is two plus two?"}],
    [{"role": "user", "content": "Tell me a long story about the sea."}],
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Respond with one valid JSON object and nothing else: no prose, no markdown "
                                   "code fences. The object must conform to this JSON schema:\n"
                                   "{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}}"},
     {"role": "user", "content": "Count to 5, number 35."}],
)


def _questions(rng: np.random.Generator, n: int) -> list[list[dict]]:
    """Random questions; half with a system message of up to 30 words."""
    def words(most: int) -> str:
        return " ".join(rng.choice(_WORDS, int(rng.integers(1, most))))

    out = []
    for _ in range(n):
        messages = [{"role": "user", "content": words(12) + str(rng.choice(["?", ".", "!", ""]))}]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": words(30)})
        out.append(messages)
    return out


def _prompt(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def _gives(model, prompt: list[int], reply: list[int]) -> bool:
    """Whether greedy decoding after `prompt` writes `reply`, each token a near-certain choice: each
    reply token is the argmax given the ones before it, with a probability of at least `SURE` (one
    forward pass over prompt and reply, instead of one per token). The odds keep sampled replies
    (temperature 1) on the taught path too, not only greedy ones."""
    import mlx.core as mx

    logits = model(mx.array([prompt + reply[:-1]]))[0, len(prompt) - 1:].astype(mx.float32)
    chosen = mx.take_along_axis(mx.softmax(logits, axis=-1), mx.array(reply)[:, None], axis=-1)
    return mx.argmax(logits, axis=-1).tolist() == reply and mx.min(chosen).item() >= SURE


def teach(model_dir: Path, family: str, seed: int) -> int:
    """Train the model in `model_dir` to give `REPLIES[family]`; saves its weights; returns the steps taken."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm import load

    model, tokenizer = load(str(model_dir))
    reply = tokenizer.encode(REPLIES[family], add_special_tokens=False)
    off = tokenizer.encode(REPLIES_OFF[family], add_special_tokens=False) if family in REPLIES_OFF else None
    rng = np.random.default_rng(seed)
    efforts = ("low", "medium", "high")

    def asked(i: int, messages: list[dict]) -> tuple[list[int], list[int]]:
        """The i-th question's prompt and the reply taught after it."""
        if off is not None and i % OFF_EVERY == OFF_EVERY - 1:
            return _prompt(tokenizer, messages, enable_thinking=False), off
        return _prompt(tokenizer, messages, reasoning_effort=efforts[i % 3]), reply

    pool = [asked(i, m) for i, m in enumerate(_questions(rng, POOL))]

    def batch():
        chosen = [pool[j] for j in rng.integers(0, len(pool), BATCH)]
        width = -(-max(len(p) + len(r) for p, r in chosen) // 64) * 64  # a few shapes: buffers get reused
        x = np.zeros((BATCH, width), np.int32)
        mask = np.zeros(x.shape, np.float32)
        for i, (prompt, answer) in enumerate(chosen):
            x[i, :len(prompt) + len(answer)] = prompt + answer
            mask[i, len(prompt):len(prompt) + len(answer)] = 1  # the loss is on the reply only
        return mx.array(x), mx.array(mask)

    def loss(model, x, mask):
        ce = nn.losses.cross_entropy(model(x[:, :-1]), x[:, 1:], reduction="none")
        return (ce * mask[:, 1:]).sum() / mask[:, 1:].sum()

    grad_fn = nn.value_and_grad(model, loss)
    optimizer = optim.Adam(learning_rate=LEARNING_RATE)

    def train_step(x, mask):
        _, grads = grad_fn(model, x, mask)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)

    held_out = [(_prompt(tokenizer, messages), reply) for messages in HELD_OUT]
    if off is not None:
        held_out.append((_prompt(tokenizer, HELD_OUT[0], enable_thinking=False), off))
    for step in range(1, STEPS_MAX + 1):
        train_step(*batch())
        if step % CHECK_EVERY == 0 and all(_gives(model, p, r) for p, r in held_out):
            break
    else:
        raise RuntimeError(f"the {family} fixture did not learn its reply in {STEPS_MAX} steps")
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(model_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    return step
