"""The prefix cache on disk (engine/caches/prefix_disk.py): a restarted engine reads back what an earlier
one read, and answers exactly as a cold engine does; files that are broken, not mlx-nb's, or another
model's are ignored with a warning and never loaded; the folder keeps its byte budget.

Every architecture family of the tiny fixtures (plain KV, hybrid SSM + KV, sliding window + KV),
several random conversations each, against an engine with no prefix cache at all."""

import logging
import random
import shutil

import pytest

from mlx_nb import Engine
from mlx_nb.engine.caches.prefix_disk import SUFFIX

NAMES = ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3", "tiny-falcon-h1"]
MAX = 8
WORDS = "river stone lamp orbit cedar violet harbor quartz meadow signal ember tundra copper lantern".split()


def conversations(seed: int, n: int = 2) -> list[list[dict]]:
    """n conversations sharing one long random system prompt (past the disk's 128-token minimum)."""
    rng = random.Random(seed)
    system = " ".join(rng.choice(WORDS) for _ in range(rng.randint(160, 260)))
    return [[{"role": "system", "content": system},
             {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))}]
            for _ in range(n)]


def answers(engine, convs) -> list:
    return [engine.submit(messages=m, max_tokens=MAX).result(timeout=300) for m in convs]


def disk_status(engine) -> dict:
    return engine.status()["prefix_cache"]["disk"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_restarted_engine_answers_from_disk_as_a_cold_one(name, seed, tmp_path):
    first, second = conversations(seed)
    with Engine(name, prefix_cache=False, wait=True) as cold:
        want = answers(cold, [first, second])
    with Engine(name, prefix_cache_dir=str(tmp_path), wait=True) as before:
        answers(before, [first])
    # closed: what it stored went to disk (as it does when idle)
    with Engine(name, prefix_cache_dir=str(tmp_path), wait=True) as after:
        assert disk_status(after)["entries"] >= 1, f"{name}: nothing was written at close"
        got = answers(after, [first, second])
        stats = after.status()["prefix_cache"]
    for c, w in zip(want, got):
        assert w.token_ids == c.token_ids, f"{name}: an answer from a cache read from disk differs"
    assert stats["hits"]["disk"] >= 1 and got[0].usage.cached_tokens >= 128, (name, stats["hits"])
    assert stats["disk"]["ignored"] == 0


def _folder_of(engine):
    from pathlib import Path

    return Path(disk_status(engine)["folder"])


def test_foreign_and_broken_files_are_ignored_with_a_warning(tmp_path, caplog):
    (conv,) = conversations(7, 1)
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), wait=True) as llama:
        answers(llama, [conv])
        llama.save_prefix_cache()
        llama_files = sorted(_folder_of(llama).glob("*" + SUFFIX))
    assert llama_files, "nothing saved"
    with Engine("tiny-gemma3", prefix_cache=False, wait=True) as cold:
        (want,) = answers(cold, [conv])
    with Engine("tiny-gemma3", prefix_cache_dir=str(tmp_path), wait=True) as gemma:
        folder = _folder_of(gemma)
    # Into gemma's folder: llama's entry (other weights), a truncated copy of it, bytes that are no
    # safetensors at all, and llama's arrays relabelled with gemma's fingerprint (a forged entry).
    shutil.copy(llama_files[0], folder / ("other-weights" + SUFFIX))
    data = llama_files[0].read_bytes()
    (folder / ("truncated" + SUFFIX)).write_bytes(data[: len(data) // 2])
    (folder / ("junk" + SUFFIX)).write_bytes(random.Random(3).randbytes(5000))
    _forge(llama_files[0], folder / ("forged" + SUFFIX), fingerprint=folder.name)
    (folder / (".stale.123456789.tmp" + SUFFIX)).write_bytes(b"cut short")
    caplog.set_level(logging.WARNING, logger="mlx_nb.engine")
    with Engine("tiny-gemma3", prefix_cache_dir=str(tmp_path), wait=True) as gemma:
        (got,) = answers(gemma, [conv])
        stats = gemma.status()["prefix_cache"]
    assert got.token_ids == want.token_ids
    assert stats["hits"]["disk"] == 0 and got.usage.cached_tokens == 0, "a file that is not gemma's was loaded"
    warned = " ".join(r.getMessage() for r in caplog.records)
    for name in ("other-weights", "truncated", "junk", "forged"):
        assert f"{name}{SUFFIX}" in warned, f"no warning for {name}"
    assert "other weights" in warned and "truncated" in warned and "not this model's cache layers" in warned
    # broken files are deleted, a stale temporary file too; another model's files are left alone
    assert not (folder / ("truncated" + SUFFIX)).exists() and not (folder / ("junk" + SUFFIX)).exists()
    assert not (folder / (".stale.123456789.tmp" + SUFFIX)).exists()
    assert (folder / ("other-weights" + SUFFIX)).exists()


def _forge(source, target, fingerprint: str) -> None:
    """source's arrays and tokens under another fingerprint (what a copied-and-edited file would be)."""
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    cache, meta = load_prompt_cache(str(source), return_metadata=True)
    save_prompt_cache(str(target), cache, {**meta, "mlx_nb_fingerprint": fingerprint})


def test_the_folder_keeps_its_budget_and_least_recently_used_goes_first(tmp_path):
    convs = [conversations(20 + i, 1)[0] for i in range(5)]
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), wait=True) as probe:
        answers(probe, convs[:1])
        one = probe.save_prefix_cache()["disk"]["bytes"]
        probe.clear_prefix_cache(disk=True)
        assert disk_status(probe)["entries"] == 0 and not list(_folder_of(probe).iterdir())
    budget = int(2.5 * one)
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), prefix_cache_disk_bytes=budget, wait=True) as eng:
        for conv in convs:
            answers(eng, [conv])
            eng.save_prefix_cache()
        disk = disk_status(eng)
        folder = _folder_of(eng)
    files = list(folder.iterdir())
    assert sum(f.stat().st_size for f in files) <= budget and disk["bytes"] <= budget
    assert disk["evicted"] >= 2 and disk["entries"] == len(files) >= 1
    assert not [f for f in files if f.name.startswith(".")], "a temporary file was left"
    # the newest conversation is the one kept: a new engine answers it from disk
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), prefix_cache_disk_bytes=budget, wait=True) as eng:
        (r,) = answers(eng, convs[-1:])
        assert eng.status()["prefix_cache"]["hits"]["disk"] == 1 and r.usage.cached_tokens >= 128


def test_load_reads_the_folder_into_memory_and_clear_leaves_or_deletes_it(tmp_path):
    convs = conversations(31, 3)
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), wait=True) as eng:
        answers(eng, convs)
    with Engine("tiny-llama", prefix_cache_dir=str(tmp_path), wait=True) as eng:
        assert eng.status()["prefix_cache"]["entries"] == 0
        loaded = eng.load_prefix_cache()
        assert loaded["entries"] >= 1 and loaded["disk"]["read"] == loaded["entries"]
        cleared = eng.clear_prefix_cache()
        assert cleared["entries"] == loaded["entries"] and disk_status(eng)["entries"] >= 1
        (r,) = answers(eng, convs[:1])  # memory emptied, disk kept: read from disk again
        assert eng.status()["prefix_cache"]["hits"]["disk"] == 1 and r.usage.cached_tokens >= 128
        everything = eng.clear_prefix_cache(disk=True)
        assert everything["disk_entries"] >= 1 and disk_status(eng)["entries"] == 0


def test_without_a_folder_save_and_load_say_what_to_do():
    with Engine("tiny-llama", wait=True) as eng:
        assert eng.status()["prefix_cache"]["disk"] == {"enabled": False}
        for act in (eng.save_prefix_cache, eng.load_prefix_cache):
            with pytest.raises(ValueError, match="prefix_cache_dir"):
                act()
