"""The real default model: four different questions batched answer as they do one at a time."""

from mlx_nb import Engine

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "What is 2 + 2?",
    "Write one word that rhymes with cat.",
]


def test_four_questions_batched_equal_one_at_a_time():
    # Prefix reuse off: the batched run must read its four prompts of different lengths itself, in
    # one padded batch, not take them from what the one-at-a-time runs cached.
    with Engine("smollm2-135m-instruct", prefix_cache=False, wait=True) as engine:
        chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
        alone = [engine.submit(messages=c, max_tokens=24).result() for c in chats]
        handles = [engine.submit(messages=c, max_tokens=24) for c in chats]
        batched = [h.result(timeout=300) for h in handles]
        assert engine.status()["peak_batch_size"] == 4
    assert len({len(engine.loaded.tokenizer.encode(q)) for q in QUESTIONS}) > 1  # padding is exercised
    assert all(b.usage.cached_tokens == 0 for b in batched)
    assert "Paris" in alone[0].text
    for a, b in zip(alone, batched):
        assert b.text == a.text and b.token_ids == a.token_ids
