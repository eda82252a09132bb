"""Fill-in-the-middle: a completion `suffix`, on a model whose tokenizer has FIM tokens, reads the
text before and after the hole between those tokens, and is served exactly as mlx_lm's
generate_step reads the same ids alone (built here by hand: the tiny tokenizer has one token per
byte). A model without FIM tokens says so; every known spelling is recognized."""

import pytest
from fim_fixture import AFTER, BEFORE, by_hand, fim_model

from mlx_nb import Engine
from mlx_nb.engine.inputs.fim import FORMATS, fim_format
from mlx_nb.engine.types import RequestError
from mlx_nb.models import load_model
from reference import reply_tokens


@pytest.mark.parametrize("spelling", sorted(FORMATS))
def test_each_spelling_is_recognized(tmp_path, spelling):
    assert fim_format(load_model(str(fim_model(tmp_path / spelling, spelling))).tokenizer) == spelling


def test_a_suffix_fills_the_hole_as_mlx_lm_reads_it_beside_a_plain_completion(tmp_path):
    path = fim_model(tmp_path / "fim-llama", "starcoder")
    loaded = load_model(str(path))
    want_fim = reply_tokens(loaded, by_hand("starcoder", BEFORE, AFTER), 12)
    want_plain = reply_tokens(loaded, list(BEFORE.encode()), 12)
    del loaded
    with Engine(str(path), wait=True) as engine:
        assert engine.status()["fill_in_the_middle"] == "starcoder"
        fim = engine.submit(prompt=BEFORE, suffix=AFTER, max_tokens=12, source="completer")
        plain = engine.submit(prompt=BEFORE, max_tokens=12)
        assert fim.prompt_tokens == len(BEFORE.encode()) + len(AFTER.encode()) + 3
        assert fim.result(timeout=120).token_ids == want_fim
        assert plain.result(timeout=120).token_ids == want_plain
        assert want_fim != want_plain  # the text after the hole changed what the model wrote
        with pytest.raises(RequestError, match="suffix goes with a completion prompt") as err:
            engine.submit(messages=[{"role": "user", "content": "hi"}], suffix=AFTER)
        assert err.value.field == "suffix"


def test_a_model_without_fim_tokens_says_so():
    with Engine("tiny-llama", wait=True) as engine:
        assert engine.status()["fill_in_the_middle"] is None
        with pytest.raises(RequestError, match="no fill-in-the-middle tokens.*send the prompt alone") as err:
            engine.submit(prompt=BEFORE, suffix=AFTER)
        assert err.value.field == "suffix"
        assert engine.submit(prompt=BEFORE, suffix="", max_tokens=2).result(timeout=120).error is None  # no hole
