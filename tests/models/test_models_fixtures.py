"""Each tiny fixture loads through the real loading path with the expected cache layout."""

import subprocess
import sys

import pytest

from mlx_nb.models import load_model

EXPECTED_LAYOUT = {
    "tiny-llama": ["KVCache", "KVCache"],
    "tiny-qwen3.5": ["ArraysCache", "KVCache", "ArraysCache", "KVCache"],
    "tiny-gemma3": ["RotatingKVCache", "KVCache", "RotatingKVCache", "KVCache"],
    "tiny-falcon-h1": [["ArraysCache", "KVCache"], ["ArraysCache", "KVCache"]],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_LAYOUT))
def test_tiny_fixture_cache_layout(name):
    loaded = load_model(name)
    assert loaded.kind == "text"
    assert loaded.cache_types() == EXPECTED_LAYOUT[name]
    from mlx_nb.runtime import dtype_policy

    assert loaded.dtype == dtype_policy() and loaded.dtype in ("kernels", "float32")
    assert "<|im_start|>" in loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


def test_gemma_fixture_window_is_small_enough_to_cross():
    loaded = load_model("tiny-gemma3")
    assert loaded.make_cache()[0].max_size == 8


def test_qwen_fixture_template_is_strict():
    tok = load_model("tiny-qwen3.5").tokenizer
    with pytest.raises(Exception, match="System message must be at the beginning"):
        tok.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], tokenize=False
        )
    with pytest.raises(Exception, match="alternate"):
        tok.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False
        )


def test_engine_thread_of_a_hybrid_model_does_not_abort_the_process_at_exit(tmp_path):
    # mlx 0.32 aborts at exit once a thread that ran compiled kernels has ended; engines avoid it.
    code = (
        "import mlx_nb\nfrom mlx_nb import Engine\n"
        "e = Engine('tiny-qwen3.5', wait=True)\n"
        "e.submit(prompt='hi', max_tokens=3).result()\ne.close()\n"
        "e = Engine('tiny-qwen3.5', wait=True)\ne.close()\nprint('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_two_builders_of_one_directory_build_it_once(tmp_path):
    """Test workers, notebooks and servers may ask for the same model at once: the second waits
    while the first builds, then gets the first one's complete directory without writing its own,
    and nothing else is left beside it (no temporary directory, no lock file)."""
    import threading
    import time

    from mlx_nb.models.atomic import build_atomically, is_complete

    dest, second_asking = tmp_path / "model", threading.Event()
    writes = []

    def write(tag):
        def _write(tmp):
            writes.append(tag)
            (tmp / "weights").write_text(tag)
            if tag == "first":
                second_asking.wait(timeout=10)
                time.sleep(0.5)  # the second builder is inside build_atomically, waiting on the lock
        return _write

    results = {}

    def build(tag):
        if tag == "second":
            second_asking.set()
        results[tag] = build_atomically(dest, write(tag))

    first = threading.Thread(target=build, args=("first",))
    first.start()
    while not writes:
        time.sleep(0.01)
    second = threading.Thread(target=build, args=("second",))
    second.start()
    for t in (first, second):
        t.join(timeout=20)
    assert results == {"first": dest, "second": dest}
    assert writes == ["first"]
    assert is_complete(dest) and (dest / "weights").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
