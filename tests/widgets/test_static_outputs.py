"""Static copies of the widgets' outputs: the SVG/PNG renderer on real reports, a real kernel's
outputs, the save-time strip, and nbconvert's HTML of an executed example notebook."""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import xml.etree.ElementTree as ET
import zlib

import nbformat
import pytest

import jupyter_cluster as jc
from jupyter_cluster import telemetry
from jupyter_cluster.widgets import static_render as sr
from jupyter_cluster.widgets import sweep

from ..conftest import ROOT
from ..helpers import run_notebook, unique_topic

SVG = "{http://www.w3.org/2000/svg}"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _svgs(html: str) -> dict[str, ET.Element]:
    """The SVG documents of ``<img alt=... src=data:image/svg+xml;base64,...>`` tags, by alt text."""
    found = re.findall(r'<img alt="([^"]*)"[^>]*src="data:image/svg\+xml;base64,([^"]+)"', html)
    return {alt: ET.fromstring(base64.b64decode(data)) for alt, data in found}


def _png_cells(svg: ET.Element, cols: int, rows_wanted: int) -> list[list[tuple[int, int, int]]]:
    """The cell colours (rows, top first) of the PNG a heatmap SVG embeds: ``cols`` x ``rows`` equal blocks."""
    image = svg.find(f"{SVG}image")
    assert image is not None
    png = base64.b64decode(image.get("{http://www.w3.org/1999/xlink}href").split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, colour = struct.unpack(">IIBB", png[16:26])
    assert (depth, colour) == (8, 2)
    pos, idat = 8, b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind = png[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width
    rows = []
    for y in range(height):
        line = raw[y * stride : (y + 1) * stride]
        assert line[0] == 0  # no filter
        rows.append([tuple(line[1 + 3 * x : 4 + 3 * x]) for x in range(width)])
    assert width % cols == 0 and len(rows) % rows_wanted == 0
    bx, by = width // cols, len(rows) // rows_wanted
    blocks = [
        [rows[r * by + i][c * bx + k] for i in range(by) for k in range(bx)]
        for r in range(rows_wanted)
        for c in range(cols)
    ]
    assert all(len(set(b)) == 1 for b in blocks)  # each cell one colour
    return [[blocks[r * cols + c][0] for c in range(cols)] for r in range(rows_wanted)]


def _path_points(d: str) -> list[list[tuple[float, float]]]:
    """The segments of an SVG path written as ``M x y L x y ...``."""
    segments: list[list[tuple[float, float]]] = []
    for op, x, y in re.findall(r"([ML])([-\d.]+) ([-\d.]+)", d):
        if op == "M":
            segments.append([])
        segments[-1].append((float(x), float(y)))
    return segments


# -- the renderer on real reports ----------------------------------------------------------------
def test_line_chart_draws_each_reported_series_in_its_colour_on_the_data_scale():
    topic = unique_topic("static-lines")
    for step in range(50):
        for member in range(3):
            jc.report(step=step, topic=topic, member=member, reward=10.0 * member + step / 10)
    model = telemetry.store(topic).model()
    svgs = _svgs(sr.metrics_html(model))
    assert list(svgs) == [f"{topic}: reward"]
    svg = svgs[f"{topic}: reward"]
    paths = svg.findall(f"{SVG}path")
    assert len(paths) == 3
    colours = sr.assign_colors(model["scalars"]["reward"])
    assert sorted(p.get("stroke") for p in paths) == sorted(colours.values())
    lines = {p.get("stroke"): _path_points(p.get("d")) for p in paths}
    for member in range(3):
        (points,) = lines[colours[f"member={member}"]]  # one unbroken line
        assert len(points) == 50
        xs = [x for x, _ in points]
        assert xs == sorted(xs) and xs[0] < xs[-1]
        assert points[0][1] > points[-1][1]  # rising values: drawn upwards (SVG y grows down)
    # member 2 (values 20..24.9) is drawn above member 0 (0..4.9) everywhere
    top = lines[colours["member=2"]][0]
    bottom = lines[colours["member=0"]][0]
    assert all(a[1] < b[1] for a, b in zip(top, bottom))
    # the legend names every series with its colour swatch
    labels = [t.text for t in svg.findall(f"{SVG}text")]
    assert {"member=0", "member=1", "member=2"} <= set(labels)


def test_a_gap_breaks_the_line_and_a_single_point_is_a_dot():
    svg = ET.fromstring(
        sr.line_chart_svg("loss", {"a": [[0, 1.0], [1, 2.0], [2, None], [3, 1.5], [4, 1.0]], "b": [[2, 1.0]]})
    )
    (path,) = svg.findall(f"{SVG}path")
    assert [len(s) for s in _path_points(path.get("d"))] == [2, 2]
    assert len(svg.findall(f"{SVG}circle")) == 1


def test_many_series_are_capped_at_the_highest_last_values_and_the_chart_says_so():
    topic = unique_topic("static-many")
    for step in range(5):
        for member in range(30):
            jc.report(step=step, topic=topic, member=member, score=float(member + step))
    svg = _svgs(sr.metrics_html(telemetry.store(topic).model()))[f"{topic}: score"]
    assert len(svg.findall(f"{SVG}path")) == sr.MAX_SERIES
    text = " ".join(t.text or "" for t in svg.findall(f"{SVG}text"))
    assert f"{30 - sr.MAX_SERIES} more series not drawn" in text
    assert "member=29" in text and "member=0 " not in text + " "


def test_heatmaps_hold_the_reported_vectors_on_one_colour_scale():
    topic = unique_topic("static-heat")
    for step in range(20):
        jc.report(step=step, topic=topic, arm="low", load=[float(step), 1.0, 0.0, 2.0])
        jc.report(step=step, topic=topic, arm="high", load=[40.0, 0.0, float(step), 3.0])
    model = telemetry.store(topic).model()
    svgs = _svgs(sr.metrics_html(model))
    assert sorted(svgs) == [f"{topic}: load arm=high", f"{topic}: load arm=low"]
    # 20 steps across, 4 entries up
    low, high = _png_cells(svgs[f"{topic}: load arm=low"], 20, 4), _png_cells(svgs[f"{topic}: load arm=high"], 20, 4)
    top, bottom = sr.viridis(1.0), sr.viridis(0.0)
    # one scale over both: 40 (only in "high") is the top colour, 0 the bottom one
    assert high[3][0] == top and all(px != top for row in low for px in row)
    assert low[1][0] == bottom  # entry 2 of "low" is 0 (entry 0 is the bottom row)
    assert low[3][0] == bottom and low[3][19] == sr.viridis(19 / 40)
    # a single colour bar range per vector value: both heatmaps label the same ticks
    ticks = [[t.text for t in s.findall(f"{SVG}text")][-3:] for s in svgs.values()]
    assert ticks[0] == ticks[1]


def test_colours_match_the_panels_assignment():
    # FNV-1a 32-bit test vectors (the panel's hashKey)
    assert sr._fnv1a("") == 0x811C9DC5 and sr._fnv1a("a") == 0xE40C292C and sr._fnv1a("foobar") == 0xBF9CF968
    keys = [f"member={i}" for i in range(12)]
    colours = sr.assign_colors(keys)
    assert len(set(colours.values())) == 12  # up to the palette's size, no two series share a colour
    assert sr.assign_colors(reversed(keys)) == colours  # whatever order a chart lists them in
    assert sr.assign_colors(["all"])["all"] == sr.PALETTE[0]  # assigned in natural order, not by a hash
    assert [colours[f"member={i}"] for i in range(12)] == sr.PALETTE


def test_rows_on_screen_that_would_share_a_colour_are_coloured_among_themselves():
    # the fixture's "shown" cases are checked by charts-glance.spec.ts against the panel's distinctColors()
    with open(os.path.join(ROOT, "labextension/src/__tests__/fixtures/colours.json"), encoding="utf-8") as f:
        fx = json.load(f)
    for case in fx["shown"]:
        assert sr.shown_colors(case["shown"], sr.assign_colors(case["keys"])) == case["colors"]
    topic = sr.assign_colors(f"trial={i}" for i in range(26))
    assert len({topic["trial=0"], topic["trial=12"], topic["trial=24"]}) == 1
    assert len(set(sr.shown_colors(["trial=0", "trial=12", "trial=24"], topic).values())) == 3
    assert sr.shown_colors(["trial=1", "trial=2"], topic) == {"trial=1": topic["trial=1"], "trial=2": topic["trial=2"]}


def test_colours_agree_with_the_panel_on_a_shared_fixture():
    # the same fixture labextension/src/__tests__/{charts-glance,sweep}.spec.ts check the panel's rule against
    with open(os.path.join(ROOT, "labextension/src/__tests__/fixtures/colours.json"), encoding="utf-8") as f:
        fx = json.load(f)
    assert len(fx["assign"]) > 2
    for case in fx["assign"]:
        assert sr.assign_colors(case["keys"], case["more"]) == case["colors"]
        assert sr.assign_colors(reversed(case["keys"]), reversed(case["more"])) == case["colors"]
        alone = sr.assign_colors(case["keys"])
        assert {k: case["colors"][k] for k in alone} == alone  # `more` never moves a series' colour
    rows = fx["rows"]
    series, color_keys = sweep.row_series(rows["rows"], rows["topics"])
    assert (series, color_keys) == (rows["series"], rows["colorKeys"])
    data = sweep.sweep_data(rows["rows"], [], topics=rows["topics"])
    assert [r["id"] for r in data["rows"]] == rows["ids"] and data["colorKeys"] == rows["colorKeys"]
    colors = sweep.row_colors(data)
    assert [colors[i] for i in rows["ids"]] == rows["colors"]


def test_a_metrics_copy_colours_each_series_over_the_whole_topic():
    # "arm=3" has only a vector value: the live charts still count it when they colour the topic's series
    # (it comes first and takes the first colour, so "member=1" has the second one)
    model = {"topic": "t", "scalars": {"loss": {"member=1": [[0, 1.0], [1, 2.0]]}}, "vectors": {"load": {"arm=3": {}}}}
    want = sr.assign_colors(["member=1", "arm=3"])["member=1"]
    assert want != sr.assign_colors(["member=1"])["member=1"]  # (the keys were chosen so that it matters)
    svg = _svgs(sr.metrics_html(model))["t: loss"]
    strokes = {p.get("stroke") for p in svg.iter(f"{SVG}path") if p.get("fill") == "none"}
    assert want in strokes


def test_ticks_are_round_numbers():
    assert sr.nice_ticks(0, 199, 4) == [0, 50, 100, 150]
    assert sr.nice_ticks(0, 17, 6) == [0, 5, 10, 15]  # not 0, 17, 34 ... (the panel's old heatmap ticks)
    assert sr.nice_ticks(0, 9, 6) == [0, 2, 4, 6, 8]
    assert sr.nice_ticks(-0.013, 0.27, 4) == [0, 0.1, 0.2]
    assert sr.fmt_num(3.6996850967407227) == "3.7" and sr.fmt_num(0.000012345) == "1.234e-5"


# -- saving --------------------------------------------------------------------------------------
def _nb_with(outputs: list[dict], state: dict | None = None) -> dict:
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("x", outputs=[nbformat.from_dict(o) for o in outputs])]
    )
    if state is not None:
        nb.metadata["widgets"] = {sr.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


#: an output of ours as a kernel shows it (the view and its static copy), and another library's widget
OURS = {
    "output_type": "display_data",
    "metadata": sr.metadata(),
    "data": {
        WIDGET_VIEW: {"model_id": "a1", "version_major": 2, "version_minor": 0},
        "text/plain": "t",
        "text/html": "<b>t</b>",
    },
}
OTHER = {"output_type": "display_data", "metadata": {}, "data": {WIDGET_VIEW: {"model_id": "b2"}, "text/plain": "x"}}


def test_save_keeps_only_static_copies_of_our_widgets():
    import copy

    nb = _nb_with([copy.deepcopy(OURS), copy.deepcopy(OTHER)])
    model = {"type": "notebook", "content": nb}
    sr.pre_save_hook(model=model, path="x.ipynb", contents_manager=None)
    first, second = nb["cells"][0]["outputs"]
    assert WIDGET_VIEW not in first["data"] and first["data"]["text/html"] == "<b>t</b>"
    assert WIDGET_VIEW in second["data"]  # another library's widget: untouched
    # with its state saved in the notebook ("save widget state"), our widget stays a widget
    kept = _nb_with([copy.deepcopy(OURS)], state={"a1": {"state": {}}})
    assert sr.strip_widget_views(kept) == 0


def test_save_changes_nothing_but_our_widget_references():
    """A notebook of every kind of output: the hook drops the one key it owns and nothing else."""
    import copy

    ours_alone = copy.deepcopy(OURS)
    del ours_alone["data"]["text/plain"], ours_alone["data"]["text/html"]  # a reference with no static copy
    ours_saved = copy.deepcopy(OURS)
    ours_saved["data"][WIDGET_VIEW] = dict(OURS["data"][WIDGET_VIEW], model_id="s1")
    marked_plain = {"output_type": "display_data", "metadata": sr.metadata(), "data": {"text/plain": "p"}}
    outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="hello\n"),
        nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=["Traceback", "ValueError: bad"]),
        nbformat.v4.new_output(
            "execute_result", data={"text/plain": "42", "image/png": "iVBORw0KGgo="}, execution_count=1
        ),
        copy.deepcopy(OTHER),
        ours_alone,
        ours_saved,
        marked_plain,
        copy.deepcopy(OURS),
    ]
    nb = _nb_with(outputs, state={"s1": {"state": {}}})
    nb.cells.append(nbformat.v4.new_markdown_cell("# notes"))
    nb.cells.append(nbformat.v4.new_raw_cell("raw"))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    before = copy.deepcopy(nb)
    model = {"type": "notebook", "content": nb, "format": "json"}
    sr.pre_save_hook(model=model, path="x.ipynb", contents_manager=None)
    expected = copy.deepcopy(before)
    del expected.cells[0].outputs[-1]["data"][WIDGET_VIEW]  # ours, with a static copy, its state not saved
    assert nb == expected
    nbformat.validate(nb)
    # files and other formats pass through
    for other in ({"type": "file", "content": "x"}, {"type": "notebook", "content": None}):
        kept = copy.deepcopy(other)
        sr.pre_save_hook(model=kept, path="x", contents_manager=None)
        assert kept == other


def test_a_notebook_saved_through_the_jupyter_server_keeps_the_static_copies(tmp_path):
    """The server extension's pre-save hook, through the contents API as JupyterLab saves."""
    import json

    import requests

    from ..jupyter_process import JupyterProcess

    nb = _nb_with([OURS, OTHER])
    server = JupyterProcess(str(tmp_path), app="server").start(timeout=120)
    try:
        r = requests.put(
            f"{server.url}api/contents/saved.ipynb",
            headers=server.headers,
            json={"type": "notebook", "format": "json", "content": nb},
            timeout=30,
        )
        assert r.status_code in (200, 201), r.text
    finally:
        server.stop()
    with open(tmp_path / "saved.ipynb") as f:
        first, second = json.load(f)["cells"][0]["outputs"]
    assert WIDGET_VIEW not in first["data"] and "".join(first["data"]["text/html"]) == "<b>t</b>"
    assert WIDGET_VIEW in second["data"]


# -- a real kernel ---------------------------------------------------------------------------------
def test_in_a_kernel_every_output_carries_a_static_copy_kept_current(monkeypatch):
    """The chart is shown before its reports: its static copy is brought up to date when the cell
    that reports ends; a map's progress bar ends as its static final line; the cluster's output
    holds its table.  nbconvert's HTML of the saved notebook shows them."""
    from nbconvert import HTMLExporter

    monkeypatch.setenv("DASK_JUPYTER_CLUSTER__LOCAL__WORKERS", "1")
    cells = [
        "import jupyter_cluster as jc\n%load_ext jupyter_cluster\n%cluster start",
        "jc.show_metrics('nb')",
        "for step in range(10):\n    jc.report(step=step, topic='nb', reward=step / 10)",
        "%%parallel x in range(6)\nimport time\ntime.sleep(0.4)\nx",
        "%cluster stop",
    ]
    nb = run_notebook(cells, timeout=180)

    def ours(i: int) -> list[dict]:
        return [o for o in nb.cells[i].outputs if sr.MARK in o.get("metadata", {})]

    (table,) = ours(0)
    assert WIDGET_VIEW in table["data"] and "jupyter-cluster-workers" in table["data"]["text/html"]
    assert "1 workers" in table["data"]["text/plain"]
    (chart,) = ours(1)
    assert WIDGET_VIEW in chart["data"]
    assert chart["data"]["text/plain"].startswith("metrics 'nb': 10 reports")  # updated after cell 3
    assert list(_svgs(chart["data"]["text/html"])) == ["nb: reward"]
    (line,) = ours(3)
    assert WIDGET_VIEW not in line["data"]  # the bar's widgets closed, its final line stays
    assert "6/6 (100 %)" in line["data"]["text/plain"] and "finished" in line["data"]["text/plain"]

    # nbclient saved the widget state: a front end can draw the widgets from it, so they stay
    assert sr.strip_widget_views(nb) == 0
    del nb.metadata["widgets"]  # as JupyterLab saves by default
    assert sr.strip_widget_views(nb) == 2
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert "nb: reward" in body and "data:image/svg+xml;base64," in body and "jupyter-cluster-progress" in body


# -- the published example notebooks ---------------------------------------------------------------
EXAMPLES = os.path.join(ROOT, "notebooks")


@pytest.mark.parametrize(
    ("name", "alts"),
    [
        ("02-evolution-strategies.ipynb", ["es: policy_mean", "es: population_mean"]),
        ("04-mixture-of-experts.ipynb", ["moe: dropped_tokens"] + ["moe: tokens_per_expert"] * 6),
    ],
)
def test_nbconvert_html_of_an_executed_example_shows_its_charts(name, alts):
    from nbconvert import HTMLExporter

    nb = nbformat.read(os.path.join(EXAMPLES, name), as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    shown = [alt for alt in _svgs(body)]
    for alt in set(alts):
        assert sum(1 for s in shown if s.startswith(alt)) >= alts.count(alt), (alt, shown)
    assert "model not found" not in body and "Error displaying widget" not in body


def test_a_heatmap_names_its_entries_axis_and_titles_its_colour_bar():
    vs = {"steps": [0, 1, 2], "rows": [[0.1, 0.5], [0.2, 0.6], [0.3, 0.9]]}
    texts = [t.text for t in ET.fromstring(sr.heatmap_svg("histogram", "all", vs, 0.0, 1.0)).iter(f"{SVG}text")]
    assert "histogram[i]" in texts and "index" not in texts  # the entries' axis, as the panel names it
    bar = [
        t.text
        for t in ET.fromstring(sr.heatmap_svg("histogram", "all", vs, 0.0, 1.0)).iter(f"{SVG}text")
        if t.get("class") == "jc-bar-title"
    ]
    assert bar == ["histogram"]  # the colour bar's title
    texts = [t.text for t in ET.fromstring(sr.heatmap_svg("tokens_per_expert", "all", vs, 0.0, 1.0)).iter(f"{SVG}text")]
    assert "expert" in texts and "tokens_per…" in texts


def test_keys_with_decimals_sort_by_value_in_legends_and_colour_slots():
    # lr=0.01 came before lr=0.003 (digit runs "01" < "003"); the same cases are checked by charts-glance.spec.ts
    with open(os.path.join(ROOT, "labextension/src/__tests__/fixtures/colours.json"), encoding="utf-8") as f:
        fx = json.load(f)
    for case in fx["natural"]["cases"]:
        assert sorted(case["keys"], key=sr.natural_key) == case["sorted"]
    colours = sr.assign_colors(["lr=0.01", "lr=0.003", "lr=0.001"])
    assert [colours[k] for k in ("lr=0.001", "lr=0.003", "lr=0.01")] == sr.PALETTE[:3]
    keys = ["lr=0.01", "lr=0.003"]
    assert sweep.topic_series({"scalars": {"loss": {k: [] for k in keys}}}) == ["lr=0.003", "lr=0.01"]
