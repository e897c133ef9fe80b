"""The DAG picture (frontend/dag.py): stored positions when every task has one,
grandalf's layered layout otherwise, every edge an arrow, every text escaped,
task-run states as classes, and a constant number of queries to load it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import yaml

from frontend import dag
from frontend.dag import dag_for_workflow, render_dag_svg, render_state_legend
from tests.unit.test_web_workflows import REPO

SVG = "{http://www.w3.org/2000/svg}"


def task(
    key: str, type_: str = "noop", x: int | None = None, y: int | None = None, id_: str | None = None
) -> dict:
    return {"id": id_ or f"id-{key}", "key": key, "type": type_, "position_x": x, "position_y": y}


def parse(svg: str) -> ET.Element:
    """The SVG as XML: it must be well-formed on its own (it is also served as a file)."""
    return ET.fromstring(svg)


def node_origins(svg: str) -> dict[str, tuple[float, float]]:
    """Task key -> (x, y) of its box's top-left corner."""
    out = {}
    for g in parse(svg).iter(f"{SVG}g"):
        if "node" in (g.get("class") or "").split():
            x, y = re.match(r"translate\(([-\d.]+),([-\d.]+)\)", g.get("transform")).groups()
            out[g.get("data-task-key")] = (float(x), float(y))
    return out


def box_size(svg: str) -> tuple[float, float]:
    """(width, height) of the drawing's boxes (all boxes of one drawing are alike)."""
    sizes = {
        (float(r.get("width")), float(r.get("height")))
        for r in parse(svg).iter(f"{SVG}rect")
        if r.get("class") == "node-box"
    }
    assert len(sizes) == 1, sizes
    return sizes.pop()


def no_overlaps(svg: str) -> bool:
    w, h = box_size(svg)
    at = list(node_origins(svg).values())
    return not any(
        abs(a[0] - b[0]) < w and abs(a[1] - b[1]) < h for n, a in enumerate(at) for b in at[n + 1 :]
    )


def penguins() -> tuple[list[dict], list[tuple[str, str, str]]]:
    doc = yaml.safe_load((REPO / "examples" / "penguins.yaml").read_text())
    tasks = [
        task(t["key"], t["type"], t["position"]["x"], t["position"]["y"], id_=t["key"]) for t in doc["tasks"]
    ]
    edges = [
        (d, t["key"], t.get("edge_labels", {}).get(d, ""))
        for t in doc["tasks"]
        for d in t.get("depends_on", [])
    ]
    return tasks, edges


def test_stored_positions_are_used_when_every_task_has_one():
    tasks, edges = penguins()
    svg = render_dag_svg(tasks, edges)
    assert 'data-layout="positions"' in svg
    at = node_origins(svg)
    # The canvas's arrangement is kept: columns left to right, the fan-out stacked in one column.
    assert at["extract"][0] < at["validate"][0] < at["by_island"][0] < at["aggregate"][0] < at["report"][0]
    assert at["by_species"][0] == at["by_island"][0] == at["by_sex_year"][0]
    assert at["by_species"][1] < at["by_island"][1] < at["by_sex_year"][1]
    assert at["extract"][1] == at["validate"][1] == at["by_island"][1] == at["report"][1]
    # Spread just enough for the boxes and the widest edge label between columns.
    width, _ = box_size(svg)
    gap = at["validate"][0] - at["extract"][0] - width
    assert gap >= max(dag._label_width(dag.label_lines(label)) for _, _, label in edges)
    assert no_overlaps(svg)


def test_grandalf_lays_out_left_to_right_when_a_position_is_missing(monkeypatch):
    from grandalf.layouts import SugiyamaLayout

    calls = []
    original = SugiyamaLayout.draw
    monkeypatch.setattr(
        SugiyamaLayout, "draw", lambda self, *a, **k: (calls.append(self), original(self, *a, **k))[1]
    )
    tasks, edges = penguins()
    tasks[3]["position_x"] = None
    svg = render_dag_svg(tasks, edges)
    assert calls, "grandalf's SugiyamaLayout was not used"
    assert 'data-layout="layered"' in svg
    at = node_origins(svg)
    # Layers run left to right: every edge points rightwards.
    width, _ = box_size(svg)
    for src, dst, _ in edges:
        assert at[dst][0] >= at[src][0] + width, (src, dst)
    # The three fan-out tasks share a layer, stacked without overlapping.
    assert at["by_species"][0] == at["by_island"][0] == at["by_sex_year"][0]
    assert len({at[k][1] for k in ("by_species", "by_island", "by_sex_year")}) == 3
    assert no_overlaps(svg)


def test_every_edge_is_a_path_with_an_arrowhead_and_its_label_at_the_midpoint():
    tasks, edges = penguins()
    root = parse(render_dag_svg(tasks, edges))
    markers = list(root.iter(f"{SVG}marker"))
    assert [m.get("id") for m in markers] == ["ff-dag-arrow"]
    paths = [p for p in root.iter(f"{SVG}path") if p.get("class", "").startswith("edge")]
    assert len(paths) == len(edges) == 8
    assert all(p.get("marker-end") == "url(#ff-dag-arrow)" for p in paths)
    assert {(p.get("data-from"), p.get("data-to")) for p in paths} == {(s, d) for s, d, _ in edges}
    labels = {
        g.get("data-from") + ">" + g.get("data-to"): g
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "edge-label"
    }
    assert len(labels) == 8

    def words(g):
        return [t.text for t in g.iter(f"{SVG}tspan")]

    assert words(labels["extract>validate"]) == ["typed rows"]
    assert words(labels["by_sex_year>aggregate"]) == ["mass by", "sex/year"]  # long labels wrap
    # extract -> validate is a straight horizontal edge: its label sits halfway between the boxes.
    svg = render_dag_svg(tasks, edges)
    at, (w, h) = node_origins(svg), box_size(svg)
    lx, ly = map(
        float,
        re.match(r"translate\(([-\d.]+),([-\d.]+)\)", labels["extract>validate"].get("transform")).groups(),
    )
    assert lx == pytest.approx((at["extract"][0] + w + at["validate"][0]) / 2, abs=0.1)
    assert ly == pytest.approx(at["extract"][1] + h / 2, abs=0.1)


def test_long_edges_bend_through_grandalfs_dummy_points():
    tasks = [task("a"), task("b"), task("c"), task("d")]
    edges = [("id-a", "id-b", ""), ("id-b", "id-c", ""), ("id-c", "id-d", ""), ("id-a", "id-d", "skip")]
    root = parse(render_dag_svg(tasks, edges))
    long_edge = next(
        p for p in root.iter(f"{SVG}path") if p.get("data-from") == "a" and p.get("data-to") == "d"
    )
    assert long_edge.get("d").count("C") == 3  # a cubic segment per layer crossed


def test_every_text_is_escaped():
    tasks = [task("a<b>", "ty&pe\"'"), task("c", "noop")]
    edges = [("id-a<b>", "id-c", '<i>"x"</i> & c')]
    svg = render_dag_svg(
        tasks, edges, states={"id-c": 'x" onload="alert(1)'}, link=lambda t: f'/t/{t["key"]}?"'
    )
    assert "<i>" not in svg and "<b>" not in svg
    assert "&lt;i&gt;&quot;x&quot;&lt;/i&gt; &amp; c<" in svg
    assert 'data-task-key="a&lt;b&gt;"' in svg and "ty&amp;pe&quot;&#x27;" in svg
    assert 'onload="' not in svg
    root = parse(svg)  # still well-formed
    assert root.get("class") == "dag dag-fit"


def test_states_become_classes_colours_and_labels():
    tasks = [task(k) for k in ("a", "b", "c", "d", "e", "f", "g")]
    states = dict(zip((t["id"] for t in tasks), dag.TASK_RUN_STATES, strict=True))
    svg = render_dag_svg(tasks, [], states=states)
    root = parse(svg)
    nodes = {
        g.get("data-task-key"): g for g in root.iter(f"{SVG}g") if "node" in (g.get("class") or "").split()
    }
    for t in tasks:
        state = states[t["id"]]
        g = nodes[t["key"]]
        assert g.get("class") == f"node state-{state}"
        assert g.get("id") == f"node-{t['key']}" and g.get("data-state") == state
        box = g.find(f"{SVG}rect")
        fill, stroke, ink = dag.STATE_COLOURS[state]
        assert (box.get("fill"), box.get("stroke")) == (fill, stroke)
        label = next(x for x in g.iter(f"{SVG}text") if x.get("class") == "node-state-label")
        assert label.text == state and label.get("fill") == ink
    # Without states: plain nodes, no state label.
    plain = render_dag_svg(tasks, [])
    assert plain.count('<g class="node" id="node-') == 7 and "node-state-label" not in plain
    # Every state has a rule in the stylesheet, so swapping the class recolours a node.
    css = (REPO / "frontend" / "static" / "frontend" / "workflows.css").read_text()
    for state in dag.TASK_RUN_STATES:
        assert f"svg.dag .state-{state} .node-box" in css
        assert f'class="state-{state}"' in render_state_legend()


def test_output_fits_the_csp_and_scales():
    tasks, edges = penguins()
    svg = render_dag_svg(
        tasks, edges, states={"extract": "running"}, link={"extract": "/runs/x/#task-extract"}
    )
    assert "style=" not in svg and "<script" not in svg.lower() and "javascript:" not in svg
    root = parse(svg)
    x0, y0, w, h = map(float, root.get("viewBox").split())
    assert (x0, y0) == (0, 0) and w > 0 and h > 0
    assert float(root.get("width")) == w and float(root.get("height")) == h
    # Every box is inside the viewBox.
    bw, bh = box_size(svg)
    for x, y in node_origins(svg).values():
        assert 0 <= x and x + bw <= w and 0 <= y and y + bh <= h
    assert (
        '<a class="node-link" href="/runs/x/#task-extract"><g class="node state-running" id="node-extract"'
        in svg
    )


def test_unknown_edges_are_left_out_and_an_empty_graph_says_so():
    svg = render_dag_svg([task("a")], [("id-a", "nope", ""), ("id-a", "id-a", "")])
    assert '<path class="edge"' not in svg
    empty = render_dag_svg([], [])
    assert ">No tasks</text>" in empty
    parse(empty)


def test_disconnected_parts_and_cycles_are_laid_out_without_overlap():
    tasks = [task(k) for k in "abcdefg"]
    edges = [("id-a", "id-b", ""), ("id-b", "id-c", ""), ("id-d", "id-e", ""), ("id-e", "id-d", "")]
    svg = render_dag_svg(tasks, edges)
    assert len(node_origins(svg)) == 7
    assert no_overlaps(svg)


def test_big_graphs_use_the_linear_layout(monkeypatch):
    from grandalf.layouts import SugiyamaLayout

    monkeypatch.setattr(SugiyamaLayout, "draw", lambda *a, **k: pytest.fail("grandalf used for a big graph"))
    n = dag.GRANDALF_MAX_TASKS + 50
    tasks = [task(f"t{i}") for i in range(n)]
    edges = [(f"id-t{i // 2}", f"id-t{i}", "") for i in range(1, n)]
    svg = render_dag_svg(tasks, edges)
    assert 'class="dag dag-scroll"' in svg  # too big to shrink to the page: scrolls at natural size
    at = node_origins(svg)
    assert len(at) == n
    for i in range(1, n):
        assert at[f"t{i}"][0] > at[f"t{i // 2}"][0]
    assert len(set(at.values())) == n


def test_dag_for_workflow_loads_in_two_queries_whatever_the_size(
    make_workflow, org, django_assert_num_queries
):
    small = make_workflow(
        org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}], name="small"
    )
    big_tasks = [{"key": "t0", "type": "noop"}] + [
        {"key": f"t{i}", "type": "noop", "depends_on": [f"t{i - 1}", "t0"] if i > 1 else ["t0"]}
        for i in range(1, 60)
    ]
    big = make_workflow(org, big_tasks, name="big")
    with django_assert_num_queries(2):
        svg = dag_for_workflow(small)
    assert svg.count('<g class="node"') == 2
    with django_assert_num_queries(2):
        svg = dag_for_workflow(big, states={})
    assert svg.count('<g class="node"') == 60 and svg.count('<path class="edge"') == 117


def test_dag_for_workflow_colours_by_task_id(make_workflow, org):
    from engine.models import Task

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    ids = dict(Task.objects.for_organization(org).filter(workflow=wf).values_list("key", "id"))
    svg = dag_for_workflow(wf, {ids["a"]: "succeeded", str(ids["b"]): "running"})
    assert '<g class="node state-succeeded" id="node-a"' in svg
    assert '<g class="node state-running" id="node-b"' in svg
