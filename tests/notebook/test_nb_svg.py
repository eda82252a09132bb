"""The pure drawing and table functions, on hand-written events and layouts (no engine, no widgets)."""

import xml.etree.ElementTree as ET

from mlx_nb.magics.tables import cache_table, status_table
from mlx_nb.widgets.svg_batch import REASON_COLORS, build_batch_svg, lanes_from_events
from mlx_nb.widgets.svg_cache import TYPE_COLORS, build_cache_svg


def ev(seq, kind, step, requests, **detail):
    return {"seq": seq, "kind": kind, "step": step, "time": 0.0, "requests": requests, "detail": detail}


EVENTS = [
    ev(1, "insert", 0, ["a"], prompt_tokens=5),
    ev(2, "insert", 0, ["b"], prompt_tokens=7),
    ev(3, "extend", 1, ["a"], batch_size=1),
    ev(4, "extend", 1, ["b"], batch_size=2),
    ev(5, "step", 1, ["a", "b"], batch_size=2),
    ev(6, "insert", 2, ["c<&>"], prompt_tokens=3),
    ev(7, "extend", 3, ["c<&>"], batch_size=3),
    ev(8, "step", 3, ["a", "b", "c<&>"], batch_size=3),
    ev(9, "filter", 4, ["a"], reason="stop", batch_size=2),
    ev(10, "filter", 5, ["b"], reason="length", batch_size=1),
    ev(11, "filter", 6, ["c<&>"], reason="abort", batch_size=0),
]


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, names escaped


def test_lanes_and_batch_sizes():
    lanes, sizes = lanes_from_events(list(reversed(EVENTS)))  # order comes from seq, not list order
    assert [(ln["id"], ln["insert"], ln["join"], ln["leave"], ln["reason"]) for ln in lanes] == [
        ("a", 0, 1, 4, "stop"), ("b", 0, 1, 5, "length"), ("c<&>", 2, 3, 6, "abort")]
    assert sizes == {1: 2, 3: 3, 4: 2, 5: 1, 6: 0}


def test_batch_svg_has_lanes_marks_and_legend():
    svg = build_batch_svg(EVENTS)
    root = parse(svg)
    assert root.tag.endswith("svg")
    assert svg.count('class="lane"') == 3
    assert svg.count('class="mark insert"') == 3 and svg.count('class="mark join"') == 3
    for reason in ("stop", "length", "abort"):
        assert f'class="mark leave reason-{reason}"' in svg and REASON_COLORS[reason] in svg
    assert 'class="legend"' in svg and "batch size" in svg and "<polyline" in svg
    assert "c&lt;&amp;&gt;" in svg


def test_batch_svg_mid_flight_errors_and_caps():
    late = [ev(20, "step", 9, ["x"], batch_size=1), ev(21, "error", 10, ["x"], message="boom")]
    svg = build_batch_svg(late)
    assert svg.count('class="lane"') == 1 and "reason-error" in svg and 'class="mark insert"' not in svg
    many = [ev(i + 1, "insert", i, [f"r{i}"]) for i in range(30)]
    capped = build_batch_svg(many, max_lanes=5)
    assert capped.count('class="lane"') == 5 and "+25 earlier not shown" in capped and "r29" in capped
    assert "no batch events yet" in build_batch_svg([])
    parse(build_batch_svg([]))


LAYOUT = {
    "model": "hybrid",
    "request": "req-1",
    "layers": [
        {"layer": 0, "type": "ArraysCache", "offset": None, "shapes": [[1, 3, 8], [1, 2, 4, 4]], "dtype": "float32",
         "nbytes": 352, "trimmable": False},
        {"layer": 1, "type": "KVCache", "offset": 12, "shapes": [[1, 2, 256, 16], [1, 2, 256, 16]],
         "dtype": "float16", "nbytes": 32768, "trimmable": True},
        {"layer": 2, "type": "RotatingKVCache", "offset": 12, "shapes": [], "dtype": None, "nbytes": 0,
         "trimmable": True, "window": 64},
        {"layer": 3, "type": "CacheList", "nbytes": 1024, "trimmable": False, "members": [
            {"type": "KVCache", "offset": 4, "shapes": [[1, 1, 8, 8]], "dtype": "float16", "nbytes": 512},
            {"type": "MysteryCache", "offset": 0, "shapes": [[4]], "dtype": "int32", "nbytes": 512}]},
    ],
}


def test_cache_svg_rows_colors_and_legend():
    svg = build_cache_svg(LAYOUT)
    parse(svg)
    assert svg.count('class="layer"') == 4
    for kind in ("ArraysCache", "KVCache", "RotatingKVCache", "CacheList"):
        assert f'data-type="{kind}"' in svg and TYPE_COLORS[kind] in svg
    assert "off=12 2x[1x2x256x16]" in svg
    assert "CacheList(KVCache off=4 [1x1x8x8]; MysteryCache off=0 [4])" in svg
    assert "#7f7f7f" in svg  # an unknown type gets the neutral color
    legend = svg[svg.index('class="legend"'):]
    assert all(k in legend for k in ("ArraysCache", "KVCache", "RotatingKVCache", "CacheList", "MysteryCache"))
    assert "req-1" in svg and "4 layers" in svg
    empty = build_cache_svg({"model": "m", "request": None, "layers": []})
    assert "0 layers" in empty and 'class="layer"' not in empty


def test_cache_and_status_tables():
    table = cache_table(LAYOUT)
    text, html = repr(table), table._repr_html_()
    assert "CacheList[KVCache, MysteryCache]" in text and "32.0 KiB" in text and "4 layers" in text
    assert html.count("<tr>") == 5
    status = {"model": "m", "ready": True, "batch_size": 2, "peak_batch_size": 3, "queue_length": 1,
              "requests": [{"id": "req-9", "phase": "decode", "generated_tokens": 5, "max_tokens": 9}]}
    text = repr(status_table(status, "embedded"))
    assert "2 (3)" in text and "req-9: decode 5/9 tokens" in text and "ready" in text
