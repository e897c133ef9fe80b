"""A workflow's DAG as data for the browser's drawing (issue 20; seed 003: node positions
and labelled edges).

The picture itself is drawn in the browser by ``frontend/graph/graph.js`` (built into
``frontend/static/frontend/dist/graph.js`` by ``make install``): ELK's layered layout
with crossing reduction, or the definition's canvas positions when every task has one,
fit to its card with zoom and pan, and large fan-outs collapsed into group nodes. The
workflow page and the run page send the same data in the same order, so a DAG gets the
same picture on both.

The data (``graph_data``), put in the page with ``json_script`` as ``#graph-data``::

    {"tasks": [[key, type, position_x | null, position_y | null, panel url | ""], ...],
     "edges": [[upstream index, downstream index, label], ...],
     "states": true | false}

Tasks are in the graph order (``graph_order``: by longest-path layer, then key). On the
run page the task states are a separate, small ``#graph-states`` element (``states_code``:
one letter per task, in the graph order), the only part of the graph a live update sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

TASK_RUN_STATES = ("pending", "ready", "running", "succeeded", "failed", "skipped", "cancelled")

#: One letter per task-run state in ``states_code`` (graph.js: STATE_CODES); "-" for a task with no run.
STATE_CODES: dict[str, str] = {
    "pending": "p", "ready": "r", "running": "R", "succeeded": "s", "failed": "f", "skipped": "k", "cancelled": "c",
}


def _edge_tuple(edge: Any) -> tuple[str, str, str]:
    """(from id, to id, label) of an edge given as a tuple/list or a mapping."""
    if isinstance(edge, Mapping):
        src = edge.get("from_task_id", edge.get("depends_on_id"))
        dst = edge.get("to_task_id", edge.get("task_id"))
        label = edge.get("label", "")
    else:
        src, dst, *rest = edge
        label = rest[0] if rest else ""
    return str(src), str(dst), str(label or "")


def longest_path_layers(ids: list[Any], pairs: list[tuple[Any, Any]]) -> tuple[dict[Any, int], dict[Any, list[Any]]]:
    """(column of each task: its longest distance from a root, upstream ids of each task)
    for (upstream, downstream) ``pairs``, in O(tasks + edges). The one layering of the
    web UI: the drawing's columns and the run page's task order. Pairs naming an id not
    in ``ids`` are ignored; tasks on a cycle (never in a stored definition) stay in column 0."""
    upstream: dict[Any, list[Any]] = {i: [] for i in ids}
    downstream: dict[Any, list[Any]] = {i: [] for i in ids}
    for src, dst in pairs:
        if src in upstream and dst in upstream:
            upstream[dst].append(src)
            downstream[src].append(dst)
    indegree = {i: len(upstream[i]) for i in ids}
    layer = dict.fromkeys(ids, 0)
    queue = [i for i in ids if indegree[i] == 0]
    while queue:
        nxt = []
        for i in queue:
            for d in downstream[i]:
                layer[d] = max(layer[d], layer[i] + 1)
                indegree[d] -= 1
                if indegree[d] == 0:
                    nxt.append(d)
        queue = nxt
    return layer, upstream


def graph_order(tasks: Sequence[Mapping[str, Any]], edges: Iterable[Any]) -> list[Mapping[str, Any]]:
    """``tasks`` (mappings with ``id`` and ``key``) sorted into the graph order: by their
    longest-path layer (``longest_path_layers``), then by key. Keys are unique in a
    workflow, so the order is total and the same wherever the DAG is shown (the run page's
    task rows use it too). ``edges`` as for ``graph_data``."""
    ids = [str(t["id"]) for t in tasks]
    layer, _ = longest_path_layers(ids, [_edge_tuple(e)[:2] for e in edges])
    return sorted(tasks, key=lambda t: (layer.get(str(t["id"]), 0), str(t["key"])))


def graph_data(
    tasks: Sequence[Mapping[str, Any]],
    edges: Iterable[Any],
    *,
    with_states: bool = False,
    panel_urls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``#graph-data`` document (module docstring) of a DAG, for ``json_script``.

    ``tasks``: mappings with ``id``, ``key``, ``type``, ``position_x``, ``position_y``
    (positions may be None; they are used only when every task has both), already in the
    graph order (``graph_order``). ``edges``: (from_task_id, to_task_id, label) — from
    the upstream task to the one that depends on it — or mappings with those keys; edges
    naming unknown tasks, self-edges and repeats are left out; the rest are sorted by
    (upstream index, downstream index). ``with_states``: the page
    sends ``#graph-states`` (the run page). ``panel_urls``: task id -> the URL of the
    task's panel (the run page: a click on a node opens it). Linear in tasks + edges.
    """
    index = {str(t["id"]): n for n, t in enumerate(tasks)}
    rows: list[list[Any]] = []
    for t in tasks:
        row: list[Any] = [str(t["key"]), str(t.get("type") or ""), t.get("position_x"), t.get("position_y")]
        if panel_urls is not None:
            row.append(panel_urls.get(str(t["id"]), ""))
        rows.append(row)
    out_edges: list[list[Any]] = []
    seen: set[tuple[int, int]] = set()
    for raw in edges:
        src, dst, label = _edge_tuple(raw)
        a, b = index.get(src), index.get(dst)
        if a is None or b is None or a == b or (a, b) in seen:
            continue
        seen.add((a, b))
        out_edges.append([a, b, label])
    # ELK keeps the model order of edges too: sorted, the same DAG is the same input on every page.
    out_edges.sort(key=lambda e: (e[0], e[1]))
    return {"tasks": rows, "edges": out_edges, "states": with_states}


def states_code(task_ids: Iterable[Any], states: Mapping[Any, str]) -> str:
    """The ``#graph-states`` text: one STATE_CODES letter per task of ``task_ids`` (the
    graph order), "-" for a task without a state. 300 tasks are 300 bytes."""
    return "".join(STATE_CODES.get(states.get(i, ""), "-") for i in task_ids)


def render_state_legend(states: Iterable[str] = TASK_RUN_STATES) -> SafeString:
    """A legend of task-run state colours: ``<ul class="dag-legend">`` with one
    ``<li class="state-<state>">`` (a swatch and the word) per state."""
    items = "".join(
        f'<li class="state-{escape(s)}"><span class="swatch" aria-hidden="true"></span>{escape(s)}</li>'
        for s in states
    )
    return mark_safe(f'<ul class="dag-legend" aria-label="Task states">{items}</ul>')  # noqa: S308


# --- loading -----------------------------------------------------------------------------------


def load_graph(workflow) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """(tasks, edges) of one workflow version in two queries, for ``graph_order`` and ``graph_data``.

    Tasks are dicts of id, key, type, position_x, position_y, max_attempts,
    retry_backoff_seconds, timeout_seconds, the scheduling columns (priority,
    concurrency_key, concurrency_limit, rate_key, rate_limit, rate_window_seconds, trigger_rule,
    condition) and
    depends_on (upstream keys), in the definition's order; edges are (from_task_id, to_task_id, label) as strings.
    """
    from engine.models import Task, TaskDependency

    org = workflow.organization_id
    tasks = list(
        Task.objects.for_organization(org)
        .filter(workflow=workflow)
        .order_by("created_at", "id")
        .values(
            "id",
            "key",
            "type",
            "position_x",
            "position_y",
            "max_attempts",
            "retry_backoff_seconds",
            "timeout_seconds",
            "priority",
            "concurrency_key",
            "concurrency_limit",
            "rate_key",
            "rate_limit",
            "rate_window_seconds",
            "trigger_rule",
            "condition",
        )
    )
    listed = {d.get("key"): d.get("depends_on", []) for d in (workflow.definition or {}).get("tasks", [])}
    order = {key: n for n, key in enumerate(listed)}
    tasks.sort(key=lambda t: order.get(t["key"], len(order)))
    by_id = {t["id"]: t for t in tasks}
    for t in tasks:
        t["depends_on"] = []
    edges = []
    for src, dst, label in (
        TaskDependency.objects.for_organization(org)
        .filter(workflow=workflow)
        .order_by("id")
        .values_list("depends_on_id", "task_id", "label")
    ):
        edges.append((str(src), str(dst), label))
        if dst in by_id and src in by_id:
            by_id[dst]["depends_on"].append(by_id[src]["key"])
    for t in tasks:  # dependencies in the order the definition lists them
        rank = {k: n for n, k in enumerate(listed.get(t["key"]) or [])}
        t["depends_on"].sort(key=lambda k, rank=rank: rank.get(k, len(rank)))
    return tasks, edges
