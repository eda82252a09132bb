"""The shipped compatibility matrix: complete for the installed mlx_lm, self-consistent, and the
document generated from it is current."""

import json

import pytest

from mlx_nb.compat import docs, matrix
from mlx_nb.compat.configs import architectures


@pytest.fixture(scope="module")
def shipped():
    data = matrix.read("mlx_lm", matrix.HERE)
    assert data is not None, "mlx_nb/compat/mlx_lm.json is missing: run `make compat`"
    return data


def test_every_architecture_of_the_installed_mlx_lm_is_listed(shipped):
    """An mlx-lm upgrade that adds (or drops) a module fails here until the sweep is re-run."""
    listed = [e["architecture"] for e in shipped["entries"]]
    assert sorted(listed) == sorted(set(listed)), "an architecture is listed twice"
    assert set(listed) == set(architectures()), "re-run `make compat` for the installed mlx_lm"
    from importlib.metadata import version

    assert shipped["versions"]["mlx_lm"] == version("mlx-lm")


def test_no_entry_is_batched_but_differs(shipped):
    """Each verdict is the one its checks imply; a batched entry passed every batched check."""
    for e in shipped["entries"]:
        name = e["architecture"]
        assert set(e["checks"]) == set(matrix.CHECKS), name
        assert e["verdict"] == matrix.verdict_of(e["checks"]), f"{name}: verdict does not follow from its checks"
        if e["verdict"] == "batched":
            assert all(e["checks"][c] for c in ("build", "reference", "batched", "late_join", "abort")), name
            assert e["checks"]["prefix"] is not False, name
            assert not e["details"].get("batched", {}).get("rows_differ"), name
        assert e["reason"] and "\n" not in e["reason"], name
        if e["checks"]["build"]:
            assert e["cache_types"], f"{name}: a built model lists its cache types"


def test_the_document_is_generated_from_the_data():
    """docs/compatibility.md is exactly what `python -m mlx_nb.compat.docs` writes."""
    from pathlib import Path

    doc = Path(__file__).parents[2] / "docs" / "compatibility.md"
    assert doc.read_text() == docs.render(matrix.HERE), "regenerate it: python -m mlx_nb.compat.docs"


def test_the_document_lists_every_architecture_and_counts_verdicts(shipped):
    text = docs.render(matrix.HERE)
    for e in shipped["entries"]:
        assert f"| `{e['architecture']}` |" in text
    counts = [sum(e["verdict"] == v for e in shipped["entries"]) for v in matrix.VERDICTS]
    assert f"| mlx_lm | {' | '.join(map(str, counts))} | {len(shipped['entries'])} |" in text


def test_a_vision_file_in_the_same_schema_gets_its_own_section(tmp_path, shipped):
    (tmp_path / "mlx_lm.json").write_text(json.dumps(shipped))
    entry = {"architecture": "qwen2_5_vl", "package": "mlx_vlm", "cache_types": ["KVCache"] * 2,
             "verdict": "prefill_alone", "reason": "images are prefilled per request", "checks": {}}
    vision = {"package": "mlx_vlm", "versions": shipped["versions"], "date": shipped["date"], "entries": [entry]}
    (tmp_path / "mlx_vlm.json").write_text(json.dumps(vision))
    text = docs.render(tmp_path)
    assert text.index("## Text models (mlx-lm)") < text.index("## Vision models (mlx-vlm)")
    assert "| `qwen2_5_vl` | KVCache ×2 | prefill_alone | 1/1 | images are prefilled per request |" in text
    assert "| mlx_vlm | 0 | 1 | 0 | 0 | 0 | 1 |" in text


def test_every_verdict_is_the_most_careful_of_its_instances(shipped):
    """Each architecture was measured on every instance of configs.INSTANCES (several seeds and
    config variants); it is batched only if every instance that ran is, else it takes the most
    careful verdict any instance needed, and the document shows how they split."""
    from mlx_nb.compat.checks import SEVERITY
    from mlx_nb.compat.configs import INSTANCES

    text_part, _, vision_part = docs.render(matrix.HERE).partition("## Vision models (mlx-vlm)")
    vision = matrix.read("mlx_vlm", matrix.HERE)
    for data, want, text in ((shipped, list(INSTANCES), text_part), (vision, None, vision_part)):
        for e in data["entries"]:
            name, listed = e["architecture"], e["instances"]
            assert want is None or [i["instance"] for i in listed] == want, name
            assert len(listed) >= 3, name
            ran = [i["verdict"] for i in listed if i["verdict"] not in ("untested", "untestable")]
            if ran:
                assert e["verdict"] == max(ran, key=SEVERITY.index), name
            row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
            cell = row.split(" | ")[3]
            agree = all(i["verdict"] == e["verdict"] for i in listed)
            assert cell == f"{len(listed)}/{len(listed)}" if agree else cell.endswith(f"of {len(listed)} instances"), \
                (name, cell)
