"""Streaming text is valid UTF-8 in every delta, equals the non-streamed text, holds no stop token."""

from forcing import forcing

TEXT = "🙂 你好, ok"
EOS = "<|im_end|>"


def utf8_then_eos(engine):
    eos = engine.loaded.tokenizer.convert_tokens_to_ids(EOS)
    return list(TEXT.encode("utf-8")) + [eos]  # tiny fixtures: one token per byte


def test_emoji_and_cjk_stream_in_whole_characters(llama_engine):
    ids = utf8_then_eos(llama_engine)
    deltas = list(llama_engine.submit(prompt="x", max_tokens=64, logits_processors=[forcing(ids)]))
    texts = [d.text for d in deltas]
    assert all("\ufffd" not in t for t in texts), texts
    assert "".join(texts) == TEXT
    assert not any(EOS in t for t in texts)
    assert deltas[-1].finish_reason == "stop"
    # some deltas are empty: the bytes of one character arrive over several tokens
    assert sum(1 for d in deltas if d.token_ids and not d.text) >= 3

    whole = llama_engine.submit(prompt="x", max_tokens=64, logits_processors=[forcing(ids)]).result()
    assert whole.text == TEXT and whole.finish_reason == "stop"
    assert whole.usage.completion_tokens == len(ids)


def test_stop_string_straddling_deltas_is_cut(llama_engine):
    ids = utf8_then_eos(llama_engine)
    deltas = list(
        llama_engine.submit(prompt="x", max_tokens=64, stop=["好,"], logits_processors=[forcing(ids)])
    )
    assert "".join(d.text for d in deltas) == "🙂 你"
    assert deltas[-1].finish_reason == "stop" and deltas[-1].matched_stop == "好,"
    assert all("好" not in d.text for d in deltas)


def test_length_finish(llama_engine):
    r = llama_engine.submit(prompt="hello", max_tokens=5).result()
    assert r.finish_reason == "length"
    assert r.usage.completion_tokens == 5 and len(r.token_ids) == 5


def test_async_iteration_matches_sync(llama_engine):
    import asyncio

    sync = llama_engine.submit(prompt="abc", max_tokens=8).result()

    async def run():
        h = llama_engine.submit(prompt="abc", max_tokens=8)
        return "".join([d.text async for d in h])

    assert asyncio.run(run()) == sync.text
