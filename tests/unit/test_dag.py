"""The DAG's data for the browser's drawing (frontend/dag.py): the graph order (layer,
then key) shared by the workflow and run pages, edges as index pairs without unknown
tasks or repeats, stored positions passed through, the run's states as one letter a
task, and a constant number of queries to load it. The drawing itself (ELK, fit, zoom,
groups) is tested in a real browser: tests/e2e/test_browser_graph.py."""

from __future__ import annotations

import json

import yaml

from frontend.dag import graph_data, graph_order, load_graph, render_state_legend, states_code
from tests.unit.test_web_workflows import REPO


def task(key: str, type_: str = "noop", x: int | None = None, y: int | None = None) -> dict:
    return {"id": f"id-{key}", "key": key, "type": type_, "position_x": x, "position_y": y}


def test_graph_order_is_by_layer_then_key_whatever_the_input_order():
    tasks = [task("join"), task("b"), task("start"), task("a"), task("c")]
    edges = [("id-start", "id-a", ""), ("id-start", "id-b", ""), ("id-start", "id-c", ""),
             ("id-a", "id-join", ""), ("id-b", "id-join", ""), ("id-c", "id-join", "")]
    expected = ["start", "a", "b", "c", "join"]
    assert [t["key"] for t in graph_order(tasks, edges)] == expected
    assert [t["key"] for t in graph_order(list(reversed(tasks)), list(reversed(edges)))] == expected


def test_graph_data_has_tasks_in_the_given_order_and_edges_as_index_pairs():
    tasks = [task("extract", "http"), task("load", "sql"), task("notify")]
    edges = [
        ("id-extract", "id-load", "rows"),
        ("id-extract", "id-load", "again"),  # a repeat: left out
        ("id-load", "id-notify", ""),
        ("id-load", "id-load", ""),  # a self-edge: left out
        ("id-ghost", "id-notify", ""),  # an unknown task: left out
        {"from_task_id": "id-extract", "to_task_id": "id-notify", "label": "done"},
    ]
    data = graph_data(tasks, edges)
    assert data == {
        "tasks": [["extract", "http", None, None], ["load", "sql", None, None], ["notify", "noop", None, None]],
        "edges": [[0, 1, "rows"], [0, 2, "done"], [1, 2, ""]],
        "states": False,
    }


def test_run_page_data_carries_panel_urls_and_states_flag():
    tasks = [task("a"), task("b")]
    data = graph_data(tasks, [("id-a", "id-b", "")], with_states=True, panel_urls={"id-a": "/runs/r/tasks/1/"})
    assert data["tasks"] == [["a", "noop", None, None, "/runs/r/tasks/1/"], ["b", "noop", None, None, ""]]
    assert data["states"] is True


def test_stored_positions_are_passed_through():
    doc = yaml.safe_load((REPO / "examples" / "penguins.yaml").read_text())
    tasks = [task(t["key"], t["type"], t["position"]["x"], t["position"]["y"]) for t in doc["tasks"]]
    data = graph_data(tasks, [])
    assert [(row[2], row[3]) for row in data["tasks"]] == [(t["position"]["x"], t["position"]["y"]) for t in doc["tasks"]]


def test_states_code_is_one_letter_per_task_in_the_given_order():
    states = {1: "pending", 2: "ready", 3: "running", 4: "succeeded", 5: "failed", 6: "skipped", 7: "cancelled"}
    assert states_code([7, 6, 5, 4, 3, 2, 1, 8], states) == "ckfsRrp-"


def test_texts_are_escaped_in_the_page_by_json_script():
    from django.utils.html import json_script

    data = graph_data([task("<script>alert(1)</script>")], [])
    out = json_script(data, "graph-data")
    assert "<script>alert" not in out and "\\u003Cscript\\u003E" in out
    assert json.loads(out.split(">", 1)[1].rsplit("<", 1)[0]) == data


def test_state_legend_lists_every_state():
    legend = render_state_legend()
    for state in ("pending", "ready", "running", "succeeded", "failed", "skipped", "cancelled"):
        assert f'<li class="state-{state}">' in legend


def test_load_graph_takes_two_queries_whatever_the_size(make_workflow, org, django_assert_num_queries):
    big_tasks = [{"key": "t0", "type": "noop"}] + [
        {"key": f"t{i}", "type": "noop", "depends_on": [f"t{i - 1}", "t0"] if i > 1 else ["t0"]}
        for i in range(1, 60)
    ]
    big = make_workflow(org, big_tasks, name="big")
    with django_assert_num_queries(2):
        tasks, edges = load_graph(big)
    data = graph_data(graph_order(tasks, edges), edges)
    assert len(data["tasks"]) == 60 and len(data["edges"]) == 117
    assert [row[0] for row in data["tasks"]][:3] == ["t0", "t1", "t2"]  # t2 depends on t1: a layer later


def test_a_missing_graph_bundle_is_a_system_check_warning(monkeypatch, tmp_path):
    from frontend import checks

    assert checks.check_graph_bundle() == []  # make install built it
    monkeypatch.setattr(checks, "GRAPH_BUNDLE", tmp_path / "graph.js")
    [warning] = checks.check_graph_bundle()
    assert warning.id == "frontend.W002" and "make install" in warning.hint
