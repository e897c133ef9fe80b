"""Drawing a workflow's DAG as inline SVG (seed 003: node positions and labelled edges).

``render_dag_svg`` draws tasks as rounded boxes (key and type) and dependencies as
arrows from the upstream task to the downstream one, each edge's label at its midpoint.
Layout: the stored canvas positions when every task has one (seed 003), else a
layered (Sugiyama) layout from grandalf, left to right.

The markup is made for the pages' Content-Security-Policy (no inline script, no
``style=`` attribute): the look comes from SVG presentation attributes, so a saved
.svg file looks right on its own, and every element carries a class that
``frontend/static/frontend/workflows.css`` may override (CSS wins over presentation
attributes). For a page that refreshes a run's picture:

- a node is ``<g class="node state-<state>" id="node-<task key>" data-task-key=..
  data-state=..>``; swapping the ``state-*`` class recolours it (workflows.css has a
  rule per state), and its ``.node-state-label`` text is the state word;
- an edge is ``<path class="edge from-<upstream state>" data-from=.. data-to=..>``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Geometry, in SVG user units (CSS pixels at scale 1).
MIN_NODE_WIDTH = 150
MIN_NODE_WIDTH_WITH_STATES = 180  # the state word shares the second line with the type
MAX_NODE_WIDTH = 232
NODE_HEIGHT = 60
NODE_RADIUS = 10
NODE_TEXT_X = 20  # left edge of a box's texts (the accent bar is left of it)
KEY_FONT_SIZE = 15
KEY_CHAR_WIDTH = 8.6  # average advance of a 15px semi-bold character
TYPE_FONT_SIZE = 12.5
STATE_LABEL_WIDTH = 72  # room the state word takes on a box's second line
PADDING = 24  # around the drawing
MIN_LAYER_GAP = 56  # horizontal room between two columns, before labels ask for more
ROW_GAP = 36  # vertical room between two boxes of one column
LABEL_FONT_SIZE = 12
LABEL_CHAR_WIDTH = 6.9  # average advance of a 12px sans-serif character
LABEL_LINE_HEIGHT = 15
LABEL_PAD_X = 8
LABEL_WRAP_CHARS = 14  # an edge label longer than this wraps onto a second line
LABEL_MAX_LINES = 2
# Above this many tasks grandalf's pure-Python Sugiyama gets slow (about 0.3 s at 250);
# a longest-path layering with one barycentre pass stands in for it.
GRANDALF_MAX_TASKS = 250
# ... and when its edges would span more than this many layers in all: its crossing
# reduction works on a dummy vertex per layer a long edge crosses (2,500 took 0.4 s;
# 250 tasks with 500 long edges, 7 s).
GRANDALF_MAX_DUMMIES = 2000
# Above this many edges no graph is drawn (a note says so): the SVG grows by ~250 bytes
# an edge, and a page showing 50,000 of them helps nobody.
MAX_DRAWN_EDGES = 5000
# Drawings wider than this (user units) are shown at their natural size in a scrolling
# box (class "dag-scroll") instead of being shrunk to the page's width ("dag-fit").
FIT_MAX_WIDTH = 1800
# Stored canvas positions are spread apart by at most this factor when their columns
# are too close for the boxes and the edge labels between them.
MAX_POSITION_SCALE = 3.0

FONT_FAMILY = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'

TASK_RUN_STATES = ("pending", "ready", "running", "succeeded", "failed", "skipped", "cancelled")

# Per state: (box fill, box stroke, dot and label colour). The same colours are in
# workflows.css (--st-<state>-*); these make a standalone file look right.
STATE_COLOURS: dict[str, tuple[str, str, str]] = {
    "pending": ("#f8fafc", "#cbd5e1", "#64748b"),
    "ready": ("#f0f7ff", "#93c5fd", "#2563eb"),
    "running": ("#eef4ff", "#2f5bd3", "#2f5bd3"),
    "succeeded": ("#ecfdf3", "#6fd3a0", "#067647"),
    "failed": ("#fef3f2", "#f97066", "#b42318"),
    "skipped": ("#f9fafb", "#d0d5dd", "#667085"),
    "cancelled": ("#fffaeb", "#fdb022", "#b54708"),
}
NEUTRAL_COLOURS = ("#ffffff", "#b9c3d0", "#2f5bd3")
EDGE_COLOUR = "#98a2b3"
TEXT_COLOUR = "#1c2330"
MUTED_COLOUR = "#5f6b7a"

Point = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Box:
    """The size every node of one drawing has."""

    w: float
    h: float = NODE_HEIGHT


def _num(value: float) -> str:
    """A coordinate as short text: integers without a decimal point, else 1 decimal."""
    rounded = round(value, 1)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.1f}"


def _clip(text: str, limit: int) -> str:
    limit = max(limit, 2)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def label_lines(label: str) -> list[str]:
    """An edge label broken at spaces into at most LABEL_MAX_LINES lines of about
    LABEL_WRAP_CHARS characters (a word longer than that is cut with an ellipsis)."""
    lines: list[str] = []
    for word in label.split():
        if lines and len(lines[-1]) + 1 + len(word) <= LABEL_WRAP_CHARS:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) > LABEL_MAX_LINES:
        lines = lines[: LABEL_MAX_LINES - 1] + [" ".join(lines[LABEL_MAX_LINES - 1 :])]
    return [_clip(line, LABEL_WRAP_CHARS + 4) for line in lines]


def _label_width(lines: list[str]) -> float:
    return max((len(line) for line in lines), default=0) * LABEL_CHAR_WIDTH + 2 * LABEL_PAD_X


def _node_box(tasks: Sequence[Mapping[str, Any]], *, with_states: bool) -> Box:
    """Boxes wide enough for the longest key (within MIN/MAX_NODE_WIDTH)."""
    longest = max((len(str(t["key"])) for t in tasks), default=0)
    wanted = NODE_TEXT_X + longest * KEY_CHAR_WIDTH + (34 if with_states else 16)
    least = MIN_NODE_WIDTH_WITH_STATES if with_states else MIN_NODE_WIDTH
    return Box(w=float(math.ceil(min(MAX_NODE_WIDTH, max(least, wanted)))))


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


# --- layout ------------------------------------------------------------------------------------


def _positions_from_canvas(tasks: Sequence[Mapping[str, Any]], box: Box, gap_x: float) -> dict[str, Point]:
    """Top-left corner of each box from the stored canvas positions (seed 003).

    Positions are the canvas's top-left corners. When the distinct columns (rows)
    are closer than a box plus the room its edge labels need, that axis is spread by
    a factor (at most MAX_POSITION_SCALE), which keeps every task's relative place:
    left of, above, in the same column.
    """

    def factor(values: Iterable[int], needed: float) -> float:
        distinct = sorted(set(values))
        gaps = [b - a for a, b in zip(distinct, distinct[1:], strict=False) if b - a > 0]
        if not gaps:
            return 1.0
        return min(MAX_POSITION_SCALE, max(1.0, needed / min(gaps)))

    sx = factor((t["position_x"] for t in tasks), box.w + gap_x)
    sy = factor((t["position_y"] for t in tasks), box.h + ROW_GAP)
    return {str(t["id"]): (t["position_x"] * sx, t["position_y"] * sy) for t in tasks}


class _View:
    """A grandalf vertex view: its size in, its centre out (``xy``)."""

    def __init__(self, w: float, h: float) -> None:
        self.w, self.h = w, h
        self.xy: Point = (0.0, 0.0)


class _EdgeView:
    def __init__(self) -> None:
        self.points: list[Point] = []

    def setpath(self, points: list[Point]) -> None:
        self.points = list(points)


def _layered_grandalf(
    ids: list[str], pairs: list[tuple[str, str]], box: Box, gap_x: float
) -> tuple[dict[str, Point], dict[tuple[str, str], list[Point]]]:
    """grandalf's Sugiyama layout turned left to right.

    grandalf layers top to bottom, so it is given boxes with width and height swapped
    and its (x, y) are read back as (y, x). Each connected component is laid out
    alone and the components are stacked. Returns (top-left corner per task id, the
    points that long edges bend through, per (from, to)).
    """
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    vertices = {i: Vertex(i) for i in ids}
    for v in vertices.values():
        v.view = _View(box.h, box.w)
    edges = []
    for src, dst in pairs:
        e = Edge(vertices[src], vertices[dst])
        e.view = _EdgeView()
        edges.append(e)
    graph = Graph(list(vertices.values()), edges)
    wanted = set(pairs)
    corners: dict[str, Point] = {}
    bends: dict[tuple[str, str], list[Point]] = {}
    offset_y = 0.0
    # Biggest component first, then by the first task's place in the definition.
    order = {i: n for n, i in enumerate(ids)}
    components = sorted(graph.C, key=lambda c: (-len(c.sV), min(order[v.data] for v in c.sV)))
    for component in components:
        layout = SugiyamaLayout(component)
        layout.xspace = ROW_GAP  # between boxes of one layer (vertical once turned)
        layout.yspace = gap_x  # between layers (horizontal once turned)
        layout.init_all()
        layout.draw()
        centres = {v.data: (v.view.xy[1], v.view.xy[0]) for v in component.sV}
        min_x = min(x for x, _ in centres.values()) - box.w / 2
        min_y = min(y for _, y in centres.values()) - box.h / 2
        max_y = max(y for _, y in centres.values()) + box.h / 2
        for key, (x, y) in centres.items():
            corners[key] = (x - box.w / 2 - min_x, y - box.h / 2 - min_y + offset_y)
        for e in component.sE:
            pts = [(py - min_x, px - min_y + offset_y) for px, py in e.view.points[1:-1]]
            src, dst = e.v[0].data, e.v[1].data
            if (src, dst) not in wanted:  # grandalf turned it round to break a cycle
                src, dst, pts = dst, src, pts[::-1]
            bends[(src, dst)] = pts
        offset_y += max_y - min_y + ROW_GAP * 2
    return corners, bends


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


def _long_edge_spans(ids: list[str], pairs: list[tuple[str, str]]) -> int:
    """How many columns the edges skip in all (a layered layout's dummy vertices)."""
    layer, _ = longest_path_layers(ids, pairs)
    return sum(max(0, layer[dst] - layer[src] - 1) for src, dst in pairs)


def _layered_simple(ids: list[str], pairs: list[tuple[str, str]], box: Box, gap_x: float) -> dict[str, Point]:
    """Longest-path columns, left to right, each ordered by the mean row of its tasks'
    upstream tasks: linear time, for graphs too big for grandalf."""
    layer, upstream = longest_path_layers(ids, pairs)
    layers: dict[int, list[str]] = {}
    for i in ids:  # tasks on a cycle (never in a stored definition) stay in column 0
        layers.setdefault(layer[i], []).append(i)
    row: dict[str, float] = {}
    corners: dict[str, Point] = {}
    for n in sorted(layers):
        members = layers[n]
        if n:
            members.sort(key=lambda i: sum(row.get(u, 0) for u in upstream[i]) / max(1, len(upstream[i])))
        for r, i in enumerate(members):
            row[i] = r
            corners[i] = (n * (box.w + gap_x), r * (box.h + ROW_GAP))
    return corners


# --- drawing -----------------------------------------------------------------------------------


def _ports(a: Point, b: Point, box: Box) -> tuple[Point, Point, str]:
    """Where an edge leaves box ``a`` and enters box ``b`` (top-left corners), and
    whether it runs mostly horizontally ("h") or vertically ("v")."""
    ax, ay = a
    bx, by = b
    w, h = box.w, box.h
    if bx >= ax + w * 0.75 or bx + w * 0.75 <= ax:
        if bx >= ax:
            return (ax + w, ay + h / 2), (bx, by + h / 2), "h"
        return (ax, ay + h / 2), (bx + w, by + h / 2), "h"
    if by >= ay:
        return (ax + w / 2, ay + h), (bx + w / 2, by), "v"
    return (ax + w / 2, ay), (bx + w / 2, by + h), "v"


def _curve(points: list[Point], axis: str) -> tuple[str, Point]:
    """An SVG path through ``points`` (cubic segments with tangents along ``axis``),
    and the point where the label goes (the middle of the middle segment)."""
    d = [f"M{_num(points[0][0])},{_num(points[0][1])}"]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if axis == "h":
            mx = (x1 - x0) / 2
            c1, c2 = (x0 + mx, y0), (x1 - mx, y1)
        else:
            my = (y1 - y0) / 2
            c1, c2 = (x0, y0 + my), (x1, y1 - my)
        d.append(f"C{_num(c1[0])},{_num(c1[1])} {_num(c2[0])},{_num(c2[1])} {_num(x1)},{_num(y1)}")
    mid = (len(points) - 1) // 2
    (x0, y0), (x1, y1) = points[mid], points[mid + 1]
    return " ".join(d), ((x0 + x1) / 2, (y0 + y1) / 2)


Link = Callable[[Mapping[str, Any]], str | None] | Mapping[str, str] | None


def _href(link: Link, task: Mapping[str, Any]) -> str | None:
    if link is None:
        return None
    if callable(link):
        return link(task)
    return link.get(str(task["id"]))


def _edge_label_svg(src_key: str, dst_key: str, lines: list[str], at: Point) -> str:
    w = _label_width(lines)
    h = LABEL_LINE_HEIGHT * len(lines) + 5
    first_dy = -(len(lines) - 1) * LABEL_LINE_HEIGHT / 2
    tspans = "".join(
        f'<tspan x="0" dy="{_num(first_dy if n == 0 else LABEL_LINE_HEIGHT)}">{escape(line)}</tspan>'
        for n, line in enumerate(lines)
    )
    return (
        f'<g class="edge-label" data-from="{src_key}" data-to="{dst_key}" '
        f'transform="translate({_num(at[0])},{_num(at[1])})">'
        f'<rect x="{_num(-w / 2)}" y="{_num(-h / 2)}" width="{_num(w)}" height="{_num(h)}" rx="{_num(min(10, h / 2))}" '
        f'fill="#ffffff" stroke="#e4e7ec"/>'
        f'<text text-anchor="middle" y="0.35em" font-size="{LABEL_FONT_SIZE}" fill="{MUTED_COLOUR}">{tspans}</text></g>'
    )


def _node_svg(task: Mapping[str, Any], at: Point, box: Box, state: str | None, href: str | None) -> str:
    key, type_name = str(task["key"]), str(task.get("type") or "")
    fill, stroke, accent = STATE_COLOURS.get(state or "", NEUTRAL_COLOURS)
    cls = "node" + (f" state-{escape(state)}" if state else "")
    title = f"{key} ({type_name})" + (f": {state}" if state else "")
    key_room = (box.w - NODE_TEXT_X - (30 if state else 12)) / KEY_CHAR_WIDTH
    type_room = (box.w - NODE_TEXT_X - (STATE_LABEL_WIDTH if state else 12)) / 7.2
    parts = [
        f'<g class="{cls}" id="node-{escape(key)}" data-task-key="{escape(key)}"'
        + (f' data-state="{escape(state)}"' if state else "")
        + f' transform="translate({_num(at[0])},{_num(at[1])})">',
        f"<title>{escape(title)}</title>",
        f'<rect class="node-box" width="{_num(box.w)}" height="{_num(box.h)}" rx="{NODE_RADIUS}" '
        f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"'
        + (' stroke-dasharray="5 4"' if state == "skipped" else "")
        + "/>",
        f'<rect class="node-accent" x="8" y="13" width="3" height="{_num(box.h - 26)}" rx="1.5" fill="{accent}"/>',
        f'<text class="node-key" x="{NODE_TEXT_X}" y="26" font-size="{KEY_FONT_SIZE}" font-weight="600" '
        f'fill="{TEXT_COLOUR}">{escape(_clip(key, int(key_room)))}</text>',
        f'<text class="node-type" x="{NODE_TEXT_X}" y="45" font-size="{TYPE_FONT_SIZE}" fill="{MUTED_COLOUR}">'
        f"{escape(_clip(type_name, int(type_room)))}</text>",
    ]
    if state:
        parts.append(
            f'<circle class="node-dot" cx="{_num(box.w - 17)}" cy="21" r="5" fill="{accent}"/>'
            f'<text class="node-state-label" x="{_num(box.w - 12)}" y="45" text-anchor="end" font-size="11.5" '
            f'font-weight="600" fill="{accent}">{escape(state)}</text>'
        )
    parts.append("</g>")
    node = "".join(parts)
    return f'<a class="node-link" href="{escape(href)}">{node}</a>' if href else node


def render_dag_svg(
    tasks: Sequence[Mapping[str, Any]],
    edges: Iterable[Any],
    *,
    states: Mapping[Any, str] | None = None,
    link: Link = None,
) -> SafeString:
    """Draw a DAG as an inline ``<svg class="dag ...">`` (safe to put in a template as is).

    ``tasks``: mappings with ``id``, ``key``, ``type``, ``position_x``, ``position_y``
    (positions may be None). ``edges``: (from_task_id, to_task_id, label) — from the
    upstream task to the one that depends on it — or mappings with those keys; edges
    naming unknown tasks are left out. ``states``: task id -> task-run state; each
    node then gets ``class="node state-<state>"``, its colour and a state label.
    ``link``: task mapping -> URL (or a task-id -> URL mapping) to make nodes links.
    Above MAX_DRAWN_EDGES edges nothing is drawn: the SVG holds a note saying so.
    Time and size are linear in tasks + edges (grandalf only for small graphs).

    Every text is escaped; the result has no script and no style attribute.
    """
    tasks = list(tasks)
    states = {str(k): str(v) for k, v in (states or {}).items()}
    by_id = {str(t["id"]): t for t in tasks}
    ids = list(by_id)
    edge_list: list[tuple[str, str, list[str]]] = []
    seen_pairs: set[tuple[str, str]] = set()
    for raw in edges:
        src, dst, label = _edge_tuple(raw)
        if src in by_id and dst in by_id and src != dst and (src, dst) not in seen_pairs:
            seen_pairs.add((src, dst))
            edge_list.append((src, dst, label_lines(label)))
    pairs = [(s, d) for s, d, _ in edge_list]
    if len(edge_list) > MAX_DRAWN_EDGES:
        return _too_large_svg(len(tasks), len(edge_list))

    box = _node_box(tasks, with_states=bool(states))
    widest_label = max((_label_width(lines) for _, _, lines in edge_list if lines), default=0.0)
    gap_x = max(MIN_LAYER_GAP, widest_label + 44)

    bends: dict[tuple[str, str], list[Point]] = {}
    if not tasks:
        corners: dict[str, Point] = {}
        layout = "empty"
    elif all(t.get("position_x") is not None and t.get("position_y") is not None for t in tasks):
        corners = _positions_from_canvas(tasks, box, gap_x)
        layout = "positions"
    elif len(tasks) <= GRANDALF_MAX_TASKS and _long_edge_spans(ids, pairs) <= GRANDALF_MAX_DUMMIES:
        corners, bends = _layered_grandalf(ids, pairs, box, gap_x)
        layout = "layered"
    else:
        corners = _layered_simple(ids, pairs, box, gap_x)
        layout = "layered"

    xs = [x for x, _ in corners.values()] or [0.0]
    ys = [y for _, y in corners.values()] or [0.0]
    shift_x, shift_y = PADDING - min(xs), PADDING - min(ys)
    placed = {i: (x + shift_x, y + shift_y) for i, (x, y) in corners.items()}
    bends = {k: [(x + shift_x, y + shift_y) for x, y in pts] for k, pts in bends.items()}
    width = math.ceil(max(xs) - min(xs) + box.w + 2 * PADDING) if tasks else 320
    height = math.ceil(max(ys) - min(ys) + box.h + 2 * PADDING) if tasks else 80

    edge_out: list[str] = []
    label_out: list[str] = []
    for src, dst, lines in edge_list:
        start, end, axis = _ports(placed[src], placed[dst], box)
        path, midpoint = _curve([start, *bends.get((src, dst), []), end], axis)
        src_key, dst_key = escape(by_id[src]["key"]), escape(by_id[dst]["key"])
        src_state = states.get(src)
        cls = "edge" + (f" from-{escape(src_state)}" if src_state else "")
        edge_out.append(
            f'<path class="{cls}" d="{path}" data-from="{src_key}" data-to="{dst_key}" fill="none" '
            f'stroke="{EDGE_COLOUR}" stroke-width="1.6" marker-end="url(#ff-dag-arrow)"/>'
        )
        if lines:
            label_out.append(_edge_label_svg(src_key, dst_key, lines, midpoint))

    node_out = [_node_svg(by_id[i], placed[i], box, states.get(i), _href(link, by_id[i])) for i in ids]
    if not tasks:
        node_out.append(
            f'<text x="{_num(width / 2)}" y="{_num(height / 2)}" text-anchor="middle" dy="0.35em" font-size="13" '
            f'fill="{MUTED_COLOUR}">No tasks</text>'
        )

    n_tasks, n_edges = len(tasks), len(edge_list)
    fit = "dag-scroll" if width > FIT_MAX_WIDTH else "dag-fit"
    return mark_safe(  # noqa: S308 — every interpolated text is escaped above
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag {fit}" data-layout="{layout}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="Workflow graph: {n_tasks} task{"s" if n_tasks != 1 else ""}, '
        f'{n_edges} dependenc{"ies" if n_edges != 1 else "y"}" font-family="{escape(FONT_FAMILY)}">'
        "<defs>"
        '<marker id="ff-dag-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
        'markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        f'<path d="M0,1 L9,5 L0,9 z" fill="{EDGE_COLOUR}"/></marker>'
        "</defs>"
        f'<g class="edges">{"".join(edge_out)}</g>'
        f'<g class="edge-labels">{"".join(label_out)}</g>'
        f'<g class="nodes">{"".join(node_out)}</g>'
        "</svg>"
    )


def _too_large_svg(n_tasks: int, n_edges: int) -> SafeString:
    """The stand-in for a graph with more than MAX_DRAWN_EDGES edges: a note, no drawing."""
    note = (f"Too large to draw: {n_tasks} tasks and {n_edges} dependencies "
            f"(at most {MAX_DRAWN_EDGES} dependencies are drawn). The task table lists them all.")
    return mark_safe(  # noqa: S308 — only numbers are interpolated
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag dag-fit" data-layout="too-large" '
        f'viewBox="0 0 900 60" width="900" height="60" role="img" aria-label="{note}" '
        f'font-family="{escape(FONT_FAMILY)}"><text x="450" y="30" text-anchor="middle" dy="0.35em" '
        f'font-size="13" fill="{MUTED_COLOUR}">{note}</text></svg>'
    )


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
    """(tasks, edges) of one workflow version in two queries, for ``render_dag_svg``.

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


def dag_for_workflow(workflow, states: Mapping[Any, str] | None = None, *, link: Link = None) -> SafeString:
    """The SVG of ``workflow``'s DAG (two queries), optionally coloured by ``states``
    (task id -> task-run state) and with nodes linked by ``link`` (see render_dag_svg)."""
    tasks, edges = load_graph(workflow)
    return render_dag_svg(tasks, edges, states=states, link=link)
