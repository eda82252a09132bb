"""load_model: the real default model offline, and one-line errors for every bad input."""

import shutil

import pytest

from mlx_nb.models import ModelNotFoundError, load_model
from mlx_nb.models.gguf import GGUFError
from mlx_nb.models.sources import _smollm2_gguf


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m-instruct")


def test_default_model_answers_paris_offline(smollm2):
    from mlx_lm import generate

    from mlx_nb.runtime import dtype_policy

    assert smollm2.kind == "text" and smollm2.dtype == dtype_policy()  # the CPU kernels where they are built
    assert smollm2.cache_types() == ["KVCache"] * 30
    prompt = smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    assert "Paris" in generate(smollm2.model, smollm2.tokenizer, prompt, max_tokens=16)


def one_line(exc) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 400, text
    return text


@pytest.mark.parametrize(
    "name,needle",
    [
        ("no-such-model", "unknown model"),
        ("tiny-nonexistent", "unknown model"),
        ("./missing/dir", "not found"),
        ("/nonexistent/model.gguf", "not found"),
        ("", "empty model name"),
    ],
)
def test_bad_names_fail_with_one_line(name, needle):
    with pytest.raises(ModelNotFoundError) as err:
        load_model(name)
    assert needle in one_line(err.value)


def test_hub_id_offline_fails_fast_listing_offline_models(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as err:
        load_model("someorg/some-model-7b")
    msg = one_line(err.value)
    assert "offline" in msg and "smollm2-135m-instruct" in msg and "tiny-llama" in msg


def test_hub_id_with_the_hub_unreachable_fails_listing_offline_models(monkeypatch, tmp_path):
    """No offline flag set, but nothing answers at the hub's address (here: a closed loopback port)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as err:
        load_model("someorg/some-model-7b")
    msg = one_line(err.value)
    assert "unreachable" in msg and "smollm2-135m-instruct" in msg


def test_corrupt_and_truncated_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_NB_HOME", str(tmp_path / "home"))
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    truncated = tmp_path / "truncated.gguf"
    with open(_smollm2_gguf(), "rb") as src:
        truncated.write_bytes(src.read(2_000_000))
    for path in (junk, truncated):
        with pytest.raises(GGUFError) as err:
            load_model(str(path))
        assert "GGUF" in one_line(err.value)
    models = tmp_path / "home" / "models"
    assert not models.exists() or not any(models.iterdir()), "a failed conversion left files behind"


def test_local_directory_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(str(tmp_path / "m"))


def test_gguf_path_is_converted_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_NB_HOME", str(tmp_path / "home"))
    copy = tmp_path / "smol.gguf"
    shutil.copy(_smollm2_gguf(), copy)
    first = load_model(str(copy))
    second = load_model(str(copy))
    assert first.path == second.path and first.path.parent == tmp_path / "home" / "models"


def _huge_page_bytes(spans: list[tuple[int, int]]) -> int:
    """AnonHugePages of the mappings overlapping the byte spans [start, end) (/proc/self/smaps), each
    mapping once: advising part of a mapping splits it, so a tensor can span several."""
    total, mappings, current = 0, set(), None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = (lo, hi) if any(lo < end and start < hi for start, end in spans) else None
            elif head == "AnonHugePages:" and current is not None and current not in mappings:
                mappings.add(current)
                total += int(line.split()[1]) * 1024
    return total


def test_neighbouring_weights_are_collapsed_together():
    """Spans less than a huge page apart are one span (a layer's small matrices side by side hold
    whole huge pages together that none holds alone); farther apart, they stay two."""
    from mlx_nb.models.huge_pages import HUGE, _joined

    spans = [(0, 3 << 20), (3 << 20, 4 << 20), (5 << 20, 6 << 20), (6 << 20 + HUGE, 9 << 20)]
    assert _joined(spans) == [(0, 6 << 20), (6 << 20 + HUGE, 9 << 20)]
    assert _joined([(0, 10), (2, 5)]) == [(0, 10)]  # one inside another
    assert _joined([]) == []


def test_load_model_collapses_the_big_weights_into_huge_pages_where_the_system_has_them(monkeypatch):
    from mlx.utils import tree_flatten

    from mlx_nb.models import huge_pages

    real, calls = huge_pages.collapse, []
    monkeypatch.setattr(huge_pages, "collapse", lambda module: calls.append(module) or real(module))
    loaded = load_model("smollm2-135m-instruct")
    assert calls == [loaded.whole_model]  # every weight the model holds, once, as it loads

    big = [a for _, a in tree_flatten(loaded.whole_model.parameters()) if a.nbytes >= 2 * huge_pages.HUGE]
    assert big, "the default model holds a tensor of 4 MiB or more (its embedding)"
    # 0 where the system gives none: not Linux, THP off, Linux before 6.1, no free huge pages right now
    collapsed = real(loaded.whole_model)
    if collapsed:  # what it says it collapsed sits in huge pages: at least each big tensor's whole 2 MiB pages
        whole = sum((a.nbytes - huge_pages.HUGE) // huge_pages.HUGE * huge_pages.HUGE for a in big)
        held = [a for _, a in tree_flatten(loaded.whole_model.parameters()) if a.nbytes >= huge_pages.MIN_BYTES]
        spans = [(huge_pages._address(a), huge_pages._address(a) + a.nbytes) for a in held]
        assert _huge_page_bytes(spans) >= collapsed >= whole > 0
    monkeypatch.setenv("MLX_NB_HUGE_PAGES", "0")
    assert real(loaded.whole_model) == 0
