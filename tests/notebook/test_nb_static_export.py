"""Saved notebooks show the widgets' pictures where no widget can run: an nbconvert HTML export.

A notebook is executed by a real kernel and saved as JupyterLab saves it (outputs, no widget
state); its HTML export must hold the batch timeline (with the chat's lane) and the cache picture.
The committed tutorials are checked the same way.
"""

import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from mlx_nb.pictures.theme import svg_of

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

CELLS = [
    "import mlx_nb\nfrom mlx_nb import Client\nfrom mlx_nb.widgets import BatchVisualizer, CacheInspector\n"
    "client = Client(model='tiny-llama', embedded=True).load()",
    "viz = BatchVisualizer(client)\nreply = client.chat('hello static export', max_tokens=4)\nviz.refresh()\nviz",
    "st = client.stream('keep going', max_tokens=2000)\nnext(st)\nCacheInspector(client, request_id=st.request_id)",
    "st.close()",
]


def pictures(nb) -> list[dict]:
    """The pictures of a notebook's HTML export: each SVG's class, group classes and texts."""
    body, _ = HTMLExporter().from_notebook_node(nb)
    found = []
    for svg in svg_of(body):
        root = ET.fromstring(svg)
        found.append({"class": root.get("class"),
                      "groups": [g.get("class") for g in root.iter() if g.tag.endswith("}g") and g.get("class")],
                      "text": [t.text for t in root.iter() if t.tag.endswith("}text")]})
    return found


def test_an_executed_notebook_exports_its_pictures(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.write(nb, tmp_path / "saved.ipynb")
    saved = nbformat.read(tmp_path / "saved.ipynb", 4)
    found = pictures(saved)
    batch = [p for p in found if p["class"] == "mlx-batch"]
    cache = [p for p in found if p["class"] == "mlx-cache"]
    assert len(batch) == 1 and len(cache) == 1, [p["class"] for p in found]
    assert "lane" in batch[0]["groups"] and "hello static export" in batch[0]["text"]
    assert "grid" in cache[0]["groups"] and any(t.startswith("row 0 · ") for t in cache[0]["text"])
    assert "BatchVisualizer(children" not in HTMLExporter().from_notebook_node(saved)[0]


@pytest.mark.parametrize("name, kind, groups", [
    ("02-concurrent-chats", "mlx-batch", {"lane", "legend"}),
    ("03-hybrid-caches", "mlx-cache", {"grid", "layer", "legend"}),
    ("07-dataset-jobs", "mlx-job", {"bar"}),
])
def test_saved_tutorials_export_their_pictures(name, kind, groups):
    found = [p for p in pictures(nbformat.read(NOTEBOOKS / f"{name}.ipynb", 4)) if p["class"] == kind]
    assert found and groups <= set(found[-1]["groups"])
