"""The real default model: four different questions batched answer as they do one at a time."""

from mlx_nb import Engine

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "What is 2 + 2?",
    "Write one word that rhymes with cat.",
]


def test_four_questions_batched_equal_mlx_lm_alone():
    # Prefix reuse off: the batched run must read its four prompts of different lengths itself, in
    # one padded batch. The reference is mlx_lm's own generate_step, one question at a time (run on
    # the engine thread, the only one that touches MLX).
    from mlx_nb.engine.inputs.messages import normalize_messages
    from mlx_nb.engine.inputs.prompts import encode_prompt, render_chat
    from held import held
    from reference import greedy_alone

    with Engine("smollm2-135m-instruct", prefix_cache=False, wait=True) as engine:
        loaded = engine.loaded
        chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
        prompts = [encode_prompt(loaded.tokenizer, render_chat(loaded.tokenizer, normalize_messages(c)), chat=True)
                   for c in chats]
        eos = set(loaded.tokenizer.eos_token_ids)
        alone = [[t for t in engine._call(lambda p=p: greedy_alone(loaded, p, 24), timeout=120) if t not in eos]
                 for p in prompts]
        with held(engine):  # the four reach the engine at one step: one padded batch
            handles = [engine.submit(messages=c, max_tokens=24) for c in chats]
        batched = [h.result(timeout=300) for h in handles]
        assert engine.status()["peak_batch_size"] == 4
        assert len({len(p) for p in prompts}) > 1  # padding is exercised
    assert all(b.usage.cached_tokens == 0 for b in batched)
    assert "Paris" in loaded.tokenizer.decode(alone[0])
    for a, b in zip(alone, batched):
        assert b.token_ids == a
