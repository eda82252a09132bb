"""The pure drawing and table functions, on hand-written events and layouts (no engine, no widgets)."""

import xml.etree.ElementTree as ET

import pytest

from mlx_nb.magics.tables import cache_table, status_table
from mlx_nb.pictures.batch import REASON_COLORS, build_batch_svg, build_models_batch_svg, lanes_from_events
from mlx_nb.pictures.cache import TYPE_COLORS, build_cache_svg


def ev(seq, kind, step, requests, **detail):
    """An event at `step`; steps are half a second apart."""
    return {"seq": seq, "kind": kind, "step": step, "time": 1000.0 + step / 2, "requests": requests, "detail": detail}


EVENTS = [
    ev(1, "insert", 0, ["a"], prompt_tokens=5, source="notebook 02.ipynb", label="Name a planet."),
    ev(2, "insert", 0, ["b"], prompt_tokens=7, source="route: OpenAI/Python", label="Name a <colour>."),
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
    t = lambda step: 1000.0 + step / 2  # noqa: E731
    assert [(ln["id"], ln["insert"], ln["join"], ln["leave"], ln["reason"]) for ln in lanes] == [
        ("a", t(0), t(1), t(4), "stop"), ("b", t(0), t(1), t(5), "length"), ("c<&>", t(2), t(3), t(6), "abort")]
    assert [(ln["source"], ln["label"], ln["tokens"]) for ln in lanes] == [
        ("notebook 02.ipynb", "Name a planet.", 2), ("route: OpenAI/Python", "Name a <colour>.", 2), (None, None, 1)]
    assert sizes == [(t(1), 1), (t(1), 2), (t(1), 2), (t(3), 3), (t(3), 3), (t(4), 2), (t(5), 1), (t(6), 0)]


def texts(root: ET.Element) -> list[ET.Element]:
    return [el for el in root.iter() if el.tag.endswith("}text")]


def test_batch_svg_has_labelled_lanes_a_time_axis_and_a_full_legend():
    svg = build_batch_svg(EVENTS)
    root = parse(svg)
    assert root.tag.endswith("svg")
    assert svg.count('class="lane"') == 3
    assert svg.count('class="mark insert"') == 3 and svg.count('class="mark join"') == 3
    for reason in ("stop", "length", "abort"):
        assert f'class="mark leave reason-{reason}"' in svg and REASON_COLORS[reason] in svg
    assert "c&lt;&amp;&gt;" in svg and "Name a &lt;colour&gt;." in svg  # names escaped
    labels = [el.text for el in texts(root)]
    assert "Name a planet." in labels and "notebook 02.ipynb" in labels and "route: OpenAI/Python" in labels
    assert ["0 s", "0.5 s", "1 s", "1.5 s", "2 s", "2.5 s", "3 s"] == [t for t in labels[1:] if t.endswith(" s")]
    assert "over 3 s" in labels[0]
    legend = svg[svg.index('class="legend"'):]
    for item in ("insert", "waiting", "join (extend)", "decoding", "leave: stop", "leave: abort", "batch size"):
        assert f">{item}<" in legend
    hover = [el.text for el in root.iter() if el.tag.endswith("}title")]
    assert any("from notebook 02.ipynb" in h and "prompt: Name a planet. (5 tokens)" in h and "waited 0.50 s" in h
               and "left: stop" in h for h in hover), hover


def test_several_models_each_get_their_own_timeline_and_adapter_lanes_say_which():
    """Each loaded model has its own batch: one titled timeline per model, one under the other,
    the legend once; a lane of a request with a LoRA adapter names it (label and hover)."""
    other = [ev(1, "insert", 0, ["x"], prompt_tokens=4, source="notebook 03.ipynb", label="Rhyme <this>.",
                adapter="terse<1>"),
             ev(2, "extend", 1, ["x"], batch_size=1), ev(3, "step", 2, ["x"], batch_size=1),
             ev(4, "filter", 3, ["x"], reason="stop", batch_size=0)]
    assert build_models_batch_svg({"only": EVENTS}) == build_batch_svg(EVENTS)
    svg = build_models_batch_svg({"tiny-llama": EVENTS, "tiny-<gemma>": other}, width=320)
    root = parse(svg)
    models = [el for el in root.iter() if el.get("class") == "model"]
    assert [m.get("data-model") for m in models] == ["tiny-llama", "tiny-<gemma>"]
    assert [len([g for g in m.iter() if g.get("class") == "lane"]) for m in models] == [3, 1]
    titles = [texts(m)[0].text for m in models]
    assert titles[0].startswith("tiny-llama: batch timeline: 3 req") and titles[1].startswith("tiny-<gemma>: ")
    assert svg.count('class="legend"') == len([el for el in models[1].iter() if el.get("class") == "legend"]) > 0
    y = [float(m.get("transform").split(",")[1].rstrip(")")) for m in models]
    assert y[0] == 0 and y[1] > 0 and float(root.get("height")) > y[1]
    lane = [g for g in models[1].iter() if g.get("class") == "lane"][0]
    assert any("@terse<1>" in "".join(el.itertext()) for el in texts(lane))
    assert "with the LoRA adapter terse<1>" in [el.text for el in lane.iter() if el.tag.endswith("}title")][0]


def test_svgs_follow_the_theme():
    """Every text and line takes the theme's font colour (dark themes: light text on dark)."""
    for svg in (build_batch_svg(EVENTS), build_cache_svg(LAYOUT), build_batch_svg([])):
        root = parse(svg)
        assert "var(--jp-ui-font-color1" in root.get("style")
        assert all(el.get("fill") == "currentColor" for el in texts(root))
        assert "#000" not in svg and 'fill="black"' not in svg


def test_batch_svg_mid_flight_errors_and_caps():
    late = [ev(20, "step", 9, ["x"], batch_size=1), ev(21, "error", 10, ["x"], message="boom")]
    svg = build_batch_svg(late)
    assert svg.count('class="lane"') == 1 and "reason-error" in svg and 'class="mark insert"' not in svg
    many = [ev(i + 1, "insert", i, [f"r{i}"], label=f"question {i}") for i in range(30)]
    capped = build_batch_svg(many, max_lanes=5)
    assert capped.count('class="lane"') == 5 and "+25 earlier not shown" in capped and "question 29" in capped
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


def test_the_prefix_cache_in_memory_and_on_disk_against_their_budgets():
    prefix = {"enabled": True, "entries": 3, "bytes": 250, "budget_bytes": 1000,
              "disk": {"enabled": True, "entries": 1, "bytes": 4000, "budget_bytes": 2000}}
    for width in (720, 300):
        root = parse(build_cache_svg({**LAYOUT, "prefix_cache": prefix}, width=width))
        stores = [g for g in root.iter() if g.get("class") == "prefix-store"]
        assert [(g.get("data-where"), g.get("data-entries")) for g in stores] == [("memory", "3"), ("disk", "1")]
        full = [float(r.get("width")) for g in stores for r in g if r.get("class") != "bar" and r.get("fill") == "none"]
        bars = [float(r.get("width")) for g in stores for r in g if r.get("class") == "bar"]
        assert bars[0] == pytest.approx(full[0] / 4, abs=0.1) and bars[1] == full[1]  # over budget: a full bar
        assert "prefix cache in memory: 3 entries, 250 B" in "".join(t.text or "" for t in texts(stores[0]))
    memory_only = build_cache_svg({**LAYOUT, "prefix_cache": {**prefix, "disk": {"enabled": False}}})
    assert memory_only.count('class="prefix-store"') == 1
    assert 'class="prefix-store"' not in build_cache_svg({**LAYOUT, "prefix_cache": {"enabled": False}})


def test_identical_layers_are_one_line():
    fresh = {"model": "m", "request": None, "layers": [
        {"layer": i, "type": "KVCache", "offset": 0, "shapes": [], "dtype": None, "nbytes": 0, "trimmable": True,
         "batch": {"rows": [{"padding": 0, "tokens": 0}], "positions": 0, "state": False}} for i in range(30)]}
    svg = build_cache_svg(fresh)
    assert svg.count('class="layer"') == 1 and 'data-layers="30"' in svg and "L0-29 KVCache off=0 empty x30" in svg
    assert "no tokens held yet" in svg
    text = repr(cache_table(fresh))
    assert text.count("KVCache") == 1 and "0-29" in text and "30 layers" in text


def batch_layer(i, kind, rows, positions, **extra):
    return {"layer": i, "type": kind, "nbytes": 100, "batch": {"rows": [{"padding": p, "tokens": t} for p, t in rows],
                                                               "positions": positions, "state": False, **extra}}


def windowed_layout() -> dict:
    """Two rows (one padded) in a sliding window, plain KV and fixed-size state layers."""
    return {"model": "m", "request": None, "layers": [
        batch_layer(0, "BatchRotatingKVCache", [(5, 3), (0, 11)], 8, window=8),
        batch_layer(1, "BatchKVCache", [(8, 3), (0, 11)], 11),
        batch_layer(2, "BatchRotatingKVCache", [(5, 3), (0, 11)], 8, window=8),
        batch_layer(3, "BatchKVCache", [(8, 3), (0, 11)], 11),
        {"layer": 4, "type": "ArraysCache", "nbytes": 64,
         "batch": {"rows": [{"padding": 0, "tokens": None}] * 2, "positions": None, "state": True}},
    ]}


def test_rows_by_positions_show_padding_tokens_and_the_window():
    root = parse(build_cache_svg(windowed_layout()))
    grids = [g for g in root.iter() if g.get("class") == "grid"]
    assert [g.get("data-type") for g in grids] == ["BatchRotatingKVCache", "BatchKVCache", "ArraysCache"]
    titles = [texts(g)[0].text for g in grids]
    assert titles == ["L0, L2 · BatchRotatingKVCache · 2 rows x 8 positions (window 8)",
                      "L1, L3 · BatchKVCache · 2 rows x 11 positions",
                      "L4 · ArraysCache · 2 rows of fixed-size state"]
    rows = [[(r.get("data-padding"), r.get("data-tokens")) for r in g if r.get("class") == "row"] for g in grids]
    assert rows[1] == [("8", "3"), ("0", "11")]
    cells = [[(c.get("class")) for c in r if c.get("class") in ("pad", "tok")] for r in grids[1] if r.get("class") == "row"]
    assert cells == [["pad"] * 8 + ["tok"] * 3, ["tok"] * 11]
    window_rows = [r for r in grids[0] if r.get("class") == "row"]
    assert [t.text for t in texts(window_rows[1])][-1] == "+3 dropped"  # 11 tokens seen, the last 8 kept
    assert sum(1 for r in grids[2].iter() if r.get("class") == "state") == 2


def test_cache_and_status_tables():
    table = cache_table(LAYOUT)
    text, html = repr(table), table._repr_html_()
    assert "CacheList[KVCache, MysteryCache]" in text and "32.0 KiB" in text and "4 layers" in text
    assert html.count("<tr>") == 5
    status = {"model": "m", "ready": True, "batch_size": 2, "peak_batch_size": 3, "queue_length": 1,
              "requests": [{"id": "req-9", "phase": "decode", "generated_tokens": 5, "max_tokens": 9}]}
    text = repr(status_table(status, "embedded"))
    assert "2 (3)" in text and "req-9: decode 5/9 tokens" in text and "ready" in text


def test_batch_svg_drawn_for_narrow_and_wide_widths():
    """Drawn for the width it is shown at: from 600 px up names sit in a column left of the lanes;
    narrower (a 320-px sidebar) each name sits above its lane and the legend wraps into rows; the
    picture is never wider than asked, so nothing is scaled down. (The browser test measures the
    rendered text against the picture's edges.)"""
    for width in (160, 234, 320, 480, 599, 600, 760, 1200):
        svg = build_batch_svg(EVENTS, width=width)
        root = parse(svg)
        assert root.get("width") == str(width) and root.get("viewBox").startswith(f"0 0 {width} ")
        names = [el for el in texts(root) if (el.text or "").startswith("Name a ")]  # cut with … when narrow
        assert len(names) == 2 and (width < 320 or "Name a <colour>." in [el.text for el in names]), width
        legend = "".join(svg[i:] for i in [svg.index('class="legend"')])
        for item in ("insert", "waiting", "join (extend)", "decoding", "leave: stop", "leave: abort", "batch size"):
            assert f">{item}<" in legend, (width, item)
        if width < 600:
            assert all(el.get("x") == "8" and el.get("text-anchor") is None for el in names), width
            assert svg.count('class="legend"') >= 2  # wrapped
            # the bars start after the name line: each lane's band sits below its name
            lanes = [g for g in root.iter() if g.get("class") == "lane"]
            for g in lanes:
                name_y = float(next(el for el in g.iter() if el.tag.endswith("}text")).get("y"))
                bar_ys = [float(el.get("y")) for el in g.iter() if el.get("class") in ("wait", "decode")]
                assert bar_ys and min(bar_ys) > name_y, width
        else:
            assert all(el.get("text-anchor") == "end" and el.get("x") == "194" for el in names), width
    assert build_batch_svg(EVENTS, width=50).count('width="160"') >= 1  # clamped to the smallest
    assert build_batch_svg(EVENTS) == build_batch_svg(EVENTS, width=760)


def test_cache_svg_drawn_for_narrow_and_wide_widths():
    """The cache picture at a sidebar's width: short row labels, each layer's bytes label above its
    bar, cells and bars inside the picture, the full texts kept as hover titles; wide as before."""
    for width in (160, 234, 320, 599, 600, 760):
        svg = build_cache_svg(windowed_layout(), width=width)
        root = parse(svg)
        assert root.get("width") == str(width), width
        narrow = width < 600
        grids = [g for g in root.iter() if g.get("class") == "grid"]
        window_rows = [r for r in grids[0] if r.get("class") == "row"]
        assert [t.text for t in texts(window_rows[1])] == (["row 1 · 11", "+3"] if narrow else
                                                           ["row 1 · 11 tokens", "+3 dropped"]), width
        assert any(el.text == "row 0 · 3 tokens, pad 5" for el in window_rows[0].iter() if el.tag.endswith("}title"))
        for rect in (el for el in root.iter() if el.get("class") in ("pad", "tok", "state", "bar")):
            assert float(rect.get("x")) + float(rect.get("width")) <= width - 8, (width, rect.attrib)
        for layer in (g for g in root.iter() if g.get("class") == "layer"):
            label_y = float(texts(layer)[0].get("y"))
            bar_y = min(float(r.get("y")) for r in layer.iter() if r.get("class") == "bar")
            assert (bar_y > label_y) == narrow, width  # the bar under its label when narrow
        legend = svg[svg.index('class="legend"'):]
        assert all(k in legend for k in ("BatchRotatingKVCache", "BatchKVCache", "ArraysCache", "left padding"))
    assert build_cache_svg(windowed_layout()) == build_cache_svg(windowed_layout(), width=760)
