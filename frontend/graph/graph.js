/* FlowForge's DAG drawing, on the workflow page and the run page (issue 20).
 *
 * The server sends the graph as data (frontend/dag.py: graph_data), this draws it:
 *  - layout: ELK's layered algorithm (elkjs; crossing reduction, model order kept so the
 *    same definition always gets the same picture) left to right; when every task has a
 *    canvas position in the definition (seed 003) those positions win;
 *  - large fan-outs (more than GROUP_MIN tasks with the same upstream and downstream
 *    tasks) are one group node with counts by state, expanded by a click (groups of more
 *    than EXPAND_MAX tasks open the list instead);
 *  - fit to the card on load, but never below MIN_SCALE (a node label is then at least
 *    10 px high): a graph too big for that is shown from its start and panned; zoom and
 *    pan with the toolbar's buttons, the wheel and dragging;
 *  - a list of the tasks (filter by key, state, group), the only view above MAX_DRAWN
 *    visible nodes;
 *  - on the run page the nodes follow the task states: the live client replaces the
 *    `[data-region=run-dag]` element, which holds the states (one letter per task); a
 *    MutationObserver redraws the colours (the layout and the zoom stay).
 *
 * Markup kept from the server-drawn version: svg.dag, g.node.state-<state>#node-<key>
 * [data-task-key][data-state], path.edge.from-<state>, text.node-key.
 */
import ELK from "elkjs/lib/elk.bundled.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const KEY_FONT = 14; // px at scale 1
const MIN_LABEL_PX = 10.5; // a node label's font size on screen, at least (the 10 px, with margin)
const MIN_SCALE = MIN_LABEL_PX / KEY_FONT;
const MAX_SCALE = 2.5;
const FIT_MAX_SCALE = 1; // fitting never magnifies
const NODE_H = 54;
const GROUP_H = 66;
const CHAR_W = 8.2; // average advance of a 14 px semi-bold character
const MIN_W = 150;
const MAX_W = 300;
const PAD = 16; // px around the drawing in the viewport
const GROUP_MIN = 21; // "more than ~20 siblings"
const EXPAND_MAX = 400; // a bigger group opens the list instead of being drawn
const MAX_DRAWN = 1500; // visible nodes above which only the list is shown
const LIST_PAGE = 200;

const STATE_CODES = {
  p: "pending", r: "ready", R: "running", s: "succeeded", f: "failed", k: "skipped", c: "cancelled",
};
const STATE_ORDER = ["failed", "running", "ready", "pending", "cancelled", "skipped", "succeeded"];

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG_NS, name);
  for (const k in attrs) node.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(node);
  return node;
}

function html(name, attrs, text) {
  const node = document.createElement(name);
  for (const k in attrs || {}) node.setAttribute(k, attrs[k]);
  if (text != null) node.textContent = text;
  return node;
}

function clip(text, chars) {
  const n = Math.max(2, Math.floor(chars));
  return text.length <= n ? text : text.slice(0, n - 1) + "…";
}

function decodeStates(code, n) {
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = STATE_CODES[code ? code[i] : ""] || null;
  return out;
}

/* The groups: tasks with the same upstream and downstream sets, more than GROUP_MIN of them. */
function findGroups(n, edges) {
  const up = Array.from({ length: n }, () => []);
  const down = Array.from({ length: n }, () => []);
  for (const [s, d] of edges) { up[d].push(s); down[s].push(d); }
  const bySig = new Map();
  for (let i = 0; i < n; i++) {
    const sig = up[i].slice().sort((a, b) => a - b).join(",") + "|" + down[i].slice().sort((a, b) => a - b).join(",");
    if (!bySig.has(sig)) bySig.set(sig, []);
    bySig.get(sig).push(i);
  }
  const groups = [];
  const groupOf = new Int32Array(n).fill(-1);
  for (const members of bySig.values()) {
    if (members.length >= GROUP_MIN) {
      for (const i of members) groupOf[i] = groups.length;
      groups.push(members);
    }
  }
  return { groups, groupOf };
}

function commonPrefix(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return a.slice(0, i);
}

class Graph {
  constructor(root) {
    this.root = root;
    const data = JSON.parse(document.getElementById("graph-data").textContent);
    this.tasks = data.tasks.map(([key, type, x, y, panel]) => ({ key, type, x, y, panel: panel || "" }));
    this.edges = data.edges; // [from index, to index, label]
    this.hasStates = !!data.states;
    this.viewport = root.querySelector("[data-graph-viewport]");
    this.note = root.querySelector("[data-graph-note]");
    this.listBox = root.querySelector("[data-graph-list]");
    this.defaultNote = this.note ? this.note.textContent : "";
    this.states = decodeStates("", this.tasks.length);
    this.readStates();
    const { groups, groupOf } = findGroups(this.tasks.length, this.edges);
    this.groups = groups.map((members, g) => {
      const keys = members.map((i) => this.tasks[i].key);
      const first = keys[0], last = keys[keys.length - 1];
      const prefix = commonPrefix(first, last);
      return { id: g, members, label: prefix.length >= 3 ? `${first} … ${last}` : `${first} … ${last}`, prefix };
    });
    this.groupOf = groupOf;
    this.expanded = new Set();
    this.view = { s: 1, tx: 0, ty: 0 };
    this.listFilter = { text: "", state: "", group: -1, shown: LIST_PAGE };
    this.elk = new ELK();
    this.positioned = this.tasks.length > 0 && this.tasks.every((t) => t.x != null && t.y != null);
    this.buildToolbar();
    this.bindPanZoom();
    this.watchStates();
    root.dataset.tasks = String(this.tasks.length);
    root.dataset.groups = String(this.groups.length);
    this.relayout(true);
  }

  /* --- states (run page) ------------------------------------------------------------------ */

  readStates() {
    const holder = document.getElementById("graph-states");
    if (!holder) return false;
    let code = "";
    try { code = JSON.parse(holder.textContent); } catch (e) { return false; }
    if (code === this.stateCode) return false; // unchanged: no redraw (it would drop the focus)
    this.stateCode = code;
    this.states = decodeStates(code, this.tasks.length);
    return true;
  }

  watchStates() {
    const region = document.querySelector("[data-region=run-dag]");
    const again = () => { if (this.readStates() && this.layout) { this.draw(); if (!this.listBox.hidden) this.renderList(); } };
    if (region) new MutationObserver(again).observe(region, { childList: true, subtree: true, characterData: true });
    document.addEventListener("flowforge:run-updated", again);
  }

  /* --- the visible graph: tasks and groups -------------------------------------------------- */

  visibleModel() {
    const nodes = [];
    const index = new Int32Array(this.tasks.length);
    const groupNode = new Map();
    for (let i = 0; i < this.tasks.length; i++) {
      const g = this.groupOf[i];
      if (g >= 0 && !this.expanded.has(g)) {
        if (!groupNode.has(g)) {
          groupNode.set(g, nodes.length);
          nodes.push({ kind: "group", group: this.groups[g], id: "g" + g });
        }
        index[i] = groupNode.get(g);
      } else {
        index[i] = nodes.length;
        nodes.push({ kind: "task", task: i, id: "t" + i });
      }
    }
    const seen = new Map();
    const edges = [];
    for (const [s, d, label] of this.edges) {
      const a = index[s], b = index[d];
      if (a === b) continue;
      const k = a + ">" + b;
      if (seen.has(k)) {
        const e = edges[seen.get(k)];
        if (e.label !== label) e.label = "";
        e.from.push(s);
        continue;
      }
      seen.set(k, edges.length);
      edges.push({ a, b, label: label || "", from: [s] });
    }
    return { nodes, edges };
  }

  nodeWidth() {
    if (this._w) return this._w;
    let longest = 0;
    for (const t of this.tasks) longest = Math.max(longest, t.key.length);
    for (const g of this.groups) longest = Math.max(longest, Math.min(g.label.length, 40));
    const extra = 36; // room for the state dot and word: the same width on the workflow and run pages
    this._w = Math.ceil(Math.min(MAX_W, Math.max(MIN_W, 22 + longest * CHAR_W + extra)));
    return this._w;
  }

  async relayout(fit) {
    const model = this.visibleModel();
    this.root.dataset.visibleNodes = String(model.nodes.length);
    if (model.nodes.length > MAX_DRAWN) {
      this.model = model;
      this.layout = null;
      this.viewport.hidden = true;
      this.setNote(`${this.tasks.length.toLocaleString("en")} tasks: too many to draw even with fan-outs grouped; the list shows them all.`);
      this.showList(true);
      return;
    }
    const w = this.nodeWidth();
    const token = (this.layoutSeq = (this.layoutSeq || 0) + 1);
    let layout;
    try {
      layout = this.positioned ? this.layoutFromPositions(model, w) : await this.layoutWithElk(model, w);
    } catch (e) {
      this.root.dataset.error = String(e);
      this.setNote("The graph could not be laid out; the list shows every task.");
      this.showList(true);
      return;
    }
    if (token !== this.layoutSeq) return; // a later expand or collapse was laid out meanwhile
    this.model = model;
    this.layout = layout;
    this.draw();
    if (fit) this.fit(); else this.apply();
    this.root.dataset.ready = "1";
    this.root.dispatchEvent(new CustomEvent("flowforge:graph-drawn", { bubbles: true }));
  }

  async layoutWithElk(model, w) {
    const children = model.nodes.map((n) => ({ id: n.id, width: w, height: n.kind === "group" ? GROUP_H : NODE_H }));
    const edges = model.edges.map((e, i) => {
      const edge = { id: "e" + i, sources: [model.nodes[e.a].id], targets: [model.nodes[e.b].id] };
      if (e.label) edge.labels = [{ text: e.label, width: Math.min(180, 14 + e.label.length * 6.8), height: 18 }];
      return edge;
    });
    const graph = {
      id: "root",
      layoutOptions: {
        "elk.algorithm": "layered",
        "elk.direction": "RIGHT",
        "elk.edgeRouting": "ORTHOGONAL",
        "elk.layered.considerModelOrder.strategy": "NODES_AND_EDGES",
        "elk.layered.crossingMinimization.strategy": "LAYER_SWEEP",
        // Network simplex keeps a node level with its neighbours: a third of the height of
        // Brandes-Koepf's on Airflow's example_complex.
        "elk.layered.nodePlacement.strategy": "NETWORK_SIMPLEX",
        // A fan-out's edges share one trunk instead of one track each.
        "elk.layered.mergeEdges": "true",
        "elk.layered.spacing.nodeNodeBetweenLayers": "60",
        "elk.layered.spacing.edgeNodeBetweenLayers": "20",
        "elk.spacing.nodeNode": "22",
        "elk.spacing.edgeNode": "14",
        "elk.spacing.edgeEdge": "8",
        "elk.spacing.componentComponent": "36",
        "elk.separateConnectedComponents": "true",
        "elk.edgeLabels.placement": "CENTER",
        "elk.padding": "[top=4,left=4,bottom=4,right=4]",
      },
      children,
      edges,
    };
    if (this.chainLike(model)) {
      // A long chain wraps into rows shaped like the card instead of one row to pan along.
      graph.layoutOptions["elk.layered.wrapping.strategy"] = "SINGLE_EDGE";
      // (Merged edges and wrapping together give wrong routes in elkjs 0.12: a chain has no fan-out to merge.)
      delete graph.layoutOptions["elk.layered.mergeEdges"];
      graph.layoutOptions["elk.aspectRatio"] = String(Math.max(1, this.viewport.clientWidth / this.maxHeight()));
    }
    const out = await this.elk.layout(graph);
    const pos = out.children.map((c) => ({ x: c.x, y: c.y, w: c.width, h: c.height }));
    const routes = out.edges.map((e) => {
      // An edge ELK split (a wrapped chain's edge back to the next row) has several
      // sections, chained by their incoming and outgoing sections: followed in order.
      const secs = e.sections || [];
      const byId = new Map(secs.map((x) => [x.id, x]));
      let sec = secs.find((x) => !(x.incomingSections || []).length) || secs[0];
      let pts = null;
      for (let guard = 0; sec && guard < secs.length; guard++) {
        const more = [sec.startPoint, ...(sec.bendPoints || []), sec.endPoint].map((p) => [p.x, p.y]);
        pts = pts ? pts.concat(more.slice(1)) : more;
        sec = byId.get((sec.outgoingSections || [])[0]);
      }
      const lab = (e.labels || [])[0];
      return { pts, label: lab ? { x: lab.x + lab.width / 2, y: lab.y + lab.height / 2, w: lab.width } : null };
    });
    return { pos, routes, width: out.width, height: out.height };
  }

  /* More than 8 layers with at most 1.5 nodes a layer on average: mostly a chain. */
  chainLike(model) {
    const n = model.nodes.length;
    const up = Array.from({ length: n }, () => []);
    for (const e of model.edges) up[e.b].push(e.a);
    const depth = new Int32Array(n).fill(-1);
    const visit = (i, guard) => {
      if (depth[i] >= 0 || guard > n) return Math.max(depth[i], 0);
      let d = 0;
      for (const u of up[i]) d = Math.max(d, visit(u, guard + 1) + 1);
      depth[i] = d;
      return d;
    };
    let layers = 0;
    for (let i = 0; i < n; i++) layers = Math.max(layers, visit(i, 0) + 1);
    return layers > 8 && n / layers <= 1.5;
  }

  maxHeight() { return Math.max(320, Math.round(window.innerHeight * 0.7)); }

  /* The definition's canvas positions (top-left corners), spread apart (at most 3 times)
   * when columns or rows are closer than a node; edges go from right side to left side. */
  layoutFromPositions(model, w) {
    const anchor = model.nodes.map((n) => this.tasks[n.kind === "task" ? n.task : n.group.members[0]]);
    const factor = (vals, need) => {
      const d = [...new Set(vals)].sort((a, b) => a - b);
      let gap = Infinity;
      for (let i = 1; i < d.length; i++) gap = Math.min(gap, d[i] - d[i - 1]);
      return gap === Infinity ? 1 : Math.min(3, Math.max(1, need / gap));
    };
    const sx = factor(anchor.map((t) => t.x), w + 50);
    const sy = factor(anchor.map((t) => t.y), NODE_H + 20);
    const minX = Math.min(...anchor.map((t) => t.x * sx)), minY = Math.min(...anchor.map((t) => t.y * sy));
    const pos = model.nodes.map((n, i) => ({
      x: anchor[i].x * sx - minX + 4, y: anchor[i].y * sy - minY + 4, w, h: n.kind === "group" ? GROUP_H : NODE_H,
    }));
    const routes = model.edges.map((e) => {
      const a = pos[e.a], b = pos[e.b];
      let p0, p1, curve = "h";
      if (b.x >= a.x + a.w) { p0 = [a.x + a.w, a.y + a.h / 2]; p1 = [b.x, b.y + b.h / 2]; } // b right of a
      else if (b.x + b.w <= a.x) { p0 = [a.x, a.y + a.h / 2]; p1 = [b.x + b.w, b.y + b.h / 2]; } // b left of a
      else { // one above the other
        curve = "v";
        p0 = [a.x + a.w / 2, a.y + (b.y > a.y ? a.h : 0)];
        p1 = [b.x + b.w / 2, b.y + (b.y > a.y ? 0 : b.h)];
      }
      return { pts: [p0, p1], curve,
        label: e.label ? { x: (p0[0] + p1[0]) / 2, y: (p0[1] + p1[1]) / 2, w: Math.min(180, 14 + e.label.length * 6.8) } : null };
    });
    const width = Math.max(...pos.map((p) => p.x + p.w)) + 4;
    const height = Math.max(...pos.map((p) => p.y + p.h)) + 4;
    return { pos, routes, width, height };
  }

  /* --- drawing ----------------------------------------------------------------------------- */

  draw() {
    const { nodes, edges } = this.model;
    const { pos, routes, width, height } = this.layout;
    let svg = this.viewport.querySelector("svg.dag");
    if (!svg) {
      svg = el("svg", { class: "dag", role: "img" }, this.viewport);
      const defs = el("defs", {}, svg);
      const m = el("marker", { id: "ff-dag-arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "9",
        markerHeight: "9", markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" }, defs);
      el("path", { d: "M0,1 L9,5 L0,9 z", class: "arrow-head" }, m);
      this.zoomLayer = el("g", { class: "zoom" }, svg);
    }
    svg.setAttribute("aria-label", `Workflow graph: ${this.tasks.length} task${this.tasks.length === 1 ? "" : "s"}, `
      + `${this.edges.length} dependenc${this.edges.length === 1 ? "y" : "ies"}`
      + (this.groups.length ? `, ${nodes.filter((n) => n.kind === "group").length} collapsed group(s)` : ""));
    svg.dataset.layout = this.positioned ? "positions" : "layered";
    this.svg = svg;
    const z = this.zoomLayer;
    z.replaceChildren();
    el("rect", { class: "graph-bounds", x: 0, y: 0, width, height, fill: "none" }, z);
    const gEdges = el("g", { class: "edges" }, z);
    const gLabels = el("g", { class: "edge-labels" }, z);
    const gNodes = el("g", { class: "nodes" }, z);
    edges.forEach((e, i) => {
      const r = routes[i];
      if (!r.pts) return;
      const fromState = this.hasStates ? this.edgeState(e) : "";
      el("path", {
        class: "edge" + (fromState ? " from-" + fromState : ""), d: this.pathOf(r), fill: "none",
        "marker-end": "url(#ff-dag-arrow)", "data-from": this.nodeKey(nodes[e.a]), "data-to": this.nodeKey(nodes[e.b]),
      }, gEdges);
      if (e.label && r.label) {
        const g = el("g", { class: "edge-label", transform: `translate(${r.label.x},${r.label.y})` }, gLabels);
        el("rect", { x: -r.label.w / 2, y: -9, width: r.label.w, height: 18, rx: 9 }, g);
        const t = el("text", { "text-anchor": "middle", y: "0.35em" }, g);
        t.textContent = clip(e.label, (r.label.w - 12) / 6.8);
      }
    });
    nodes.forEach((n, i) => {
      const p = pos[i];
      if (n.kind === "group") this.drawGroup(n.group, p, gNodes);
      else this.drawTask(n.task, p, gNodes);
    });
  }

  nodeKey(n) { return n.kind === "task" ? this.tasks[n.task].key : "group:" + n.group.id; }

  edgeState(e) {
    // A merged edge (into or out of a group) takes its worst source state.
    let best = null;
    for (const s of e.from) {
      const st = this.states[s];
      if (st && (best === null || STATE_ORDER.indexOf(st) < STATE_ORDER.indexOf(best))) best = st;
    }
    return best || "";
  }

  pathOf(r) {
    const p = r.pts;
    if (r.curve) { // straight between stored positions: one cubic segment along the main axis
      const [[x0, y0], [x1, y1]] = p;
      if (r.curve === "h") { const m = (x1 - x0) / 2; return `M${x0},${y0} C${x0 + m},${y0} ${x1 - m},${y1} ${x1},${y1}`; }
      const m = (y1 - y0) / 2;
      return `M${x0},${y0} C${x0},${y0 + m} ${x1},${y1 - m} ${x1},${y1}`;
    }
    // ELK's orthogonal route with its corners rounded.
    let d = `M${p[0][0]},${p[0][1]}`;
    for (let i = 1; i < p.length - 1; i++) {
      const [ax, ay] = p[i - 1], [bx, by] = p[i], [cx, cy] = p[i + 1];
      const r1 = Math.min(8, Math.hypot(bx - ax, by - ay) / 2), r2 = Math.min(8, Math.hypot(cx - bx, cy - by) / 2);
      const ux = Math.sign(bx - ax), uy = Math.sign(by - ay), vx = Math.sign(cx - bx), vy = Math.sign(cy - by);
      d += ` L${bx - ux * r1},${by - uy * r1} Q${bx},${by} ${bx + vx * r2},${by + vy * r2}`;
    }
    const last = p[p.length - 1];
    return d + ` L${last[0]},${last[1]}`;
  }

  drawTask(i, p, parent) {
    const t = this.tasks[i];
    const state = this.hasStates ? this.states[i] : null;
    let host = parent;
    if (this.hasStates) {
      host = el("a", { class: "node-link", href: "#task-" + t.key }, parent);
      if (t.panel) host.dataset.panelUrl = t.panel;
    }
    const g = el("g", { class: "node" + (state ? " state-" + state : ""), id: "node-" + t.key, "data-task-key": t.key,
      transform: `translate(${p.x},${p.y})` }, host);
    if (state) g.dataset.state = state;
    el("title", {}, g).textContent = `${t.key} (${t.type})` + (state ? `: ${state}` : "");
    el("rect", { class: "node-box", width: p.w, height: p.h, rx: 9 }, g);
    el("rect", { class: "node-accent", x: 7, y: 12, width: 3, height: p.h - 24, rx: 1.5 }, g);
    const keyRoom = (p.w - 22 - (state ? 28 : 10)) / CHAR_W;
    el("text", { class: "node-key", x: 18, y: 23, "font-size": KEY_FONT }, g).textContent = clip(t.key, keyRoom);
    const typeRoom = (p.w - 22 - (state ? 74 : 10)) / 6.9;
    el("text", { class: "node-type", x: 18, y: 42 }, g).textContent = clip(t.type, typeRoom);
    if (state) {
      el("circle", { class: "node-dot", cx: p.w - 16, cy: 18, r: 5 }, g);
      el("text", { class: "node-state-label", x: p.w - 11, y: 42, "text-anchor": "end" }, g).textContent = state;
    }
  }

  groupCounts(group) {
    const counts = {};
    for (const i of group.members) { const s = this.states[i] || "pending"; counts[s] = (counts[s] || 0) + 1; }
    return counts;
  }

  drawGroup(group, p, parent) {
    const n = group.members.length;
    const counts = this.hasStates ? this.groupCounts(group) : null;
    const worst = counts ? STATE_ORDER.find((s) => counts[s]) : null;
    const g = el("g", { class: "node group" + (worst ? " state-" + worst : ""), id: "group-" + group.id,
      "data-group": group.id, "data-size": n, tabindex: "0", role: "button",
      "aria-label": `${n} tasks ${group.label}: ${n > EXPAND_MAX ? "list them" : "expand"}`,
      transform: `translate(${p.x},${p.y})` }, parent);
    if (counts) g.dataset.counts = JSON.stringify(counts);
    el("title", {}, g).textContent = `${n} tasks with the same upstream and downstream tasks: ${group.label}. `
      + (counts ? Object.entries(counts).map(([s, c]) => `${c} ${s}`).join(", ") + ". " : "")
      + (n > EXPAND_MAX ? "Click to list them." : "Click to expand.");
    el("rect", { class: "node-box group-shadow", x: 6, y: 6, width: p.w, height: p.h, rx: 9 }, g);
    el("rect", { class: "node-box group-shadow", x: 3, y: 3, width: p.w, height: p.h, rx: 9 }, g);
    el("rect", { class: "node-box", width: p.w, height: p.h, rx: 9 }, g);
    el("text", { class: "node-key group-label", x: 12, y: 22, "font-size": KEY_FONT }, g)
      .textContent = clip(group.label, (p.w - 24) / CHAR_W);
    const line = el("text", { class: "node-type group-count", x: 12, y: 41 }, g);
    const total = el("tspan", { class: "group-total" }, line);
    total.textContent = `×${n.toLocaleString("en")} tasks`;
    if (counts) {
      const shown = STATE_ORDER.filter((s) => counts[s] && s !== "succeeded" && s !== "pending").slice(0, 2);
      // Only what fits the node (the title and the bar tell the rest): "80 running" after
      // "×298 tasks · 3 failed" ran past the node's edge.
      const room = (p.w - 24) / 6.9;
      let used = total.textContent.length;
      for (const s of shown) {
        const text = `${counts[s].toLocaleString("en")} ${s}`;
        if (used + 1 + text.length > room) break;
        used += 1 + text.length;
        el("tspan", { class: "group-state state-" + s, dx: 6 }, line).textContent = text;
      }
      // A bar of the members' states, in STATE_ORDER.
      let x = 12;
      const bw = p.w - 24;
      for (const s of STATE_ORDER) {
        if (!counts[s]) continue;
        const w = (bw * counts[s]) / n;
        el("rect", { class: "group-bar state-" + s, x, y: 51, width: Math.max(w, 1), height: 6 }, g);
        x += w;
      }
    } else {
      el("tspan", { dx: 6, class: "group-hint" }, line).textContent = n > EXPAND_MAX ? "· list" : "· expand";
    }
  }

  /* --- zoom and pan ----------------------------------------------------------------------- */

  size() {
    return { W: this.viewport.clientWidth, H: this.viewport.clientHeight };
  }

  /* The default view: the whole graph if it fits at a legible size, else as much as does,
   * from its start (left, and top when too tall), at the smallest legible scale. */
  fit() {
    const { width, height } = this.layout;
    const maxH = this.maxHeight();
    const W = this.viewport.clientWidth;
    let s = Math.min(FIT_MAX_SCALE, (W - 2 * PAD) / width, (maxH - 2 * PAD) / height);
    s = Math.max(MIN_SCALE, s);
    const H = Math.min(maxH, Math.max(140, Math.ceil(height * s + 2 * PAD)));
    // At the smallest legible scale part of the graph may be outside the card: say so (a
    // fresh review saw three columns of the 37-task DAG and no sign of the rest).
    // (Drawn from PAD when it does not fit with a margin on both sides: visible up to W.)
    const clipped = width * s > W - PAD + 1 || height * s > H - PAD + 1;
    this.root.dataset.clipped = clipped ? "1" : "0";
    if (clipped) {
      this.setNote(`Shown at the smallest legible size, ${Math.round(MIN_SCALE * 100)}%: part of the graph is outside `
        + "the card. Drag to pan, − to see all of it, or List.");
    } else if (this.clippedNoteShown) {
      this.setNote(this.defaultNote);
    }
    this.clippedNoteShown = clipped;
    this.viewport.style.height = H + "px";
    this.view.s = s;
    this.view.tx = width * s <= W - 2 * PAD ? (W - width * s) / 2 : PAD;
    if (height * s <= H - 2 * PAD) {
      this.view.ty = (H - height * s) / 2;
    } else {
      // Too tall: the first layer's nodes (the DAG's start) in the middle, within the drawing.
      const pos = this.layout.pos;
      const left = Math.min(...pos.map((p) => p.x));
      const first = pos.filter((p) => p.x < left + 1);
      const mid = (Math.min(...first.map((p) => p.y)) + Math.max(...first.map((p) => p.y + p.h))) / 2;
      this.view.ty = Math.min(PAD, Math.max(H - PAD - height * s, H / 2 - mid * s));
    }
    this.apply();
  }

  zoomAt(factor, cx, cy) {
    const v = this.view;
    const s = Math.min(MAX_SCALE, Math.max(0.05, v.s * factor));
    const k = s / v.s;
    v.tx = cx - (cx - v.tx) * k;
    v.ty = cy - (cy - v.ty) * k;
    v.s = s;
    this.apply();
  }

  apply() {
    const v = this.view;
    if (!this.zoomLayer) return;
    this.zoomLayer.setAttribute("transform", `translate(${v.tx.toFixed(2)},${v.ty.toFixed(2)}) scale(${v.s.toFixed(4)})`);
    this.root.dataset.scale = v.s.toFixed(4);
    const pct = this.root.querySelector("[data-graph-scale]");
    if (pct) pct.textContent = Math.round(v.s * 100) + "%";
  }

  bindPanZoom() {
    const vp = this.viewport;
    vp.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const r = vp.getBoundingClientRect();
      const dy = ev.deltaMode === 1 ? ev.deltaY * 16 : ev.deltaY;
      this.zoomAt(Math.pow(1.0015, -dy), ev.clientX - r.left, ev.clientY - r.top);
    }, { passive: false });
    let drag = null;
    vp.addEventListener("pointerdown", (ev) => {
      if (ev.button !== 0) return;
      drag = { x: ev.clientX, y: ev.clientY, tx: this.view.tx, ty: this.view.ty, moved: false, id: ev.pointerId };
    });
    vp.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (!drag.moved && Math.hypot(dx, dy) < 4) return;
      if (!drag.moved) { drag.moved = true; vp.setPointerCapture(drag.id); vp.classList.add("panning"); }
      this.view.tx = drag.tx + dx;
      this.view.ty = drag.ty + dy;
      this.apply();
    });
    const end = () => {
      if (drag && drag.moved) { this.suppressClick = true; setTimeout(() => { this.suppressClick = false; }, 0); }
      drag = null;
      vp.classList.remove("panning");
    };
    vp.addEventListener("pointerup", end);
    vp.addEventListener("pointercancel", end);
    vp.addEventListener("click", (ev) => {
      if (this.suppressClick) { ev.preventDefault(); ev.stopPropagation(); return; }
      const group = ev.target.closest("[data-group]");
      if (group) { ev.preventDefault(); this.openGroup(Number(group.dataset.group)); return; }
      const link = ev.target.closest("a.node-link");
      if (link && link.dataset.panelUrl && window.htmx) {
        // The run page: the node opens the task's panel, as its key in the task table does.
        ev.preventDefault();
        window.htmx.ajax("GET", link.dataset.panelUrl, { target: "#task-panel", swap: "innerHTML show:#task-panel:top" });
      }
    }, true);
    vp.addEventListener("keydown", (ev) => {
      const group = ev.target.closest && ev.target.closest("[data-group]");
      if (group && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); this.openGroup(Number(group.dataset.group)); return; }
      const step = 60;
      const moves = { ArrowLeft: [step, 0], ArrowRight: [-step, 0], ArrowUp: [0, step], ArrowDown: [0, -step] };
      if (moves[ev.key]) { ev.preventDefault(); this.view.tx += moves[ev.key][0]; this.view.ty += moves[ev.key][1]; this.apply(); }
      else if (ev.key === "+" || ev.key === "=") { this.zoomCentre(1.25); }
      else if (ev.key === "-") { this.zoomCentre(0.8); }
    });
    window.addEventListener("resize", () => { if (this.layout) this.fit(); });
  }

  zoomCentre(factor) {
    const { W, H } = this.size();
    this.zoomAt(factor, W / 2, H / 2);
  }

  openGroup(g) {
    const group = this.groups[g];
    if (group.members.length > EXPAND_MAX) {
      this.listFilter = { text: "", state: "", group: g, shown: LIST_PAGE };
      this.showList(true);
      return;
    }
    this.expanded.add(g);
    this.syncCollapse();
    this.relayout(true);
  }

  syncCollapse() {
    const b = this.root.querySelector("[data-graph-action=collapse]");
    if (b) b.hidden = this.expanded.size === 0;
  }

  /* --- toolbar and list ------------------------------------------------------------------- */

  setNote(text) { if (this.note) this.note.textContent = text; }

  buildToolbar() {
    this.root.querySelectorAll("[data-graph-action]").forEach((b) => {
      b.addEventListener("click", () => {
        const a = b.dataset.graphAction;
        if (a === "zoom-in") this.zoomCentre(1.25);
        else if (a === "zoom-out") this.zoomCentre(0.8);
        else if (a === "fit") this.fit();
        else if (a === "actual") { const { W, H } = this.size(); this.zoomAt(1 / this.view.s, W / 2, H / 2); }
        else if (a === "collapse") { this.expanded.clear(); this.syncCollapse(); this.relayout(true); }
        else if (a === "list") this.showList(this.listBox.hidden);
      });
    });
    const big = this.groups.reduce((n, g) => n + g.members.length, 0);
    if (this.groups.length) {
      this.defaultNote = `${this.groups.length} fan-out${this.groups.length === 1 ? "" : "s"} of `
        + `${big.toLocaleString("en")} tasks shown as groups: click one to open it.`;
      if (!this.clippedNoteShown) this.setNote(this.defaultNote);
    }
  }

  showList(on) {
    this.listBox.hidden = !on;
    const b = this.root.querySelector("[data-graph-action=list]");
    if (b) { b.setAttribute("aria-pressed", on ? "true" : "false"); b.textContent = on ? "Hide list" : "List"; }
    if (on) { this.renderList(); this.listBox.scrollIntoView({ block: "nearest" }); }
  }

  renderList() {
    const f = this.listFilter;
    const box = this.listBox;
    box.replaceChildren();
    const bar = html("div", { class: "graph-list-filters" });
    const input = html("input", { type: "search", placeholder: "Filter by key", "aria-label": "Filter tasks by key",
      "data-list-filter": "" });
    input.value = f.text;
    input.addEventListener("input", () => { f.text = input.value; f.shown = LIST_PAGE; this.renderRows(); });
    bar.appendChild(input);
    if (this.hasStates) {
      const sel = html("select", { "aria-label": "Filter tasks by state", "data-list-state": "" });
      sel.appendChild(html("option", { value: "" }, "every state"));
      for (const s of STATE_ORDER) sel.appendChild(html("option", { value: s }, s));
      sel.value = f.state;
      sel.addEventListener("change", () => { f.state = sel.value; f.shown = LIST_PAGE; this.renderRows(); });
      bar.appendChild(sel);
    }
    if (f.group >= 0) {
      const chip = html("button", { type: "button", class: "button small outline", "data-list-group": f.group },
        `in group ${this.groups[f.group].label} ✕`);
      chip.addEventListener("click", () => { f.group = -1; this.renderList(); });
      bar.appendChild(chip);
    }
    box.appendChild(bar);
    this.listBody = html("div", { class: "graph-list-body" });
    box.appendChild(this.listBody);
    this.renderRows();
  }

  renderRows() {
    const f = this.listFilter;
    const text = f.text.trim().toLowerCase();
    const hits = [];
    const pool = f.group >= 0 ? this.groups[f.group].members : this.tasks.map((_, i) => i);
    for (const i of pool) {
      const t = this.tasks[i];
      if (text && !t.key.toLowerCase().includes(text)) continue;
      if (f.state && this.states[i] !== f.state) continue;
      hits.push(i);
    }
    const table = html("table", { class: "graph-list-table" });
    const head = html("tr");
    for (const h of ["Key", "Type", ...(this.hasStates ? ["State"] : []), "Group"]) head.appendChild(html("th", {}, h));
    table.appendChild(html("thead")).appendChild(head);
    const body = html("tbody");
    for (const i of hits.slice(0, f.shown)) {
      const t = this.tasks[i];
      const tr = html("tr", { "data-task-key": t.key });
      const key = html("td", { class: "mono" });
      if (this.hasStates) { // the run page: the key opens the task's panel (its row without htmx)
        const a = html("a", { href: "#task-" + t.key }, t.key);
        if (t.panel) a.dataset.panelUrl = t.panel;
        key.appendChild(a);
      } else {
        key.textContent = t.key;
      }
      tr.appendChild(key);
      tr.appendChild(html("td", {}, t.type));
      if (this.hasStates) {
        const td = html("td");
        const st = this.states[i] || "pending";
        td.appendChild(html("span", { class: "badge state-" + st }, st));
        tr.appendChild(td);
      }
      tr.appendChild(html("td", { class: "muted" }, this.groupOf[i] >= 0 ? `×${this.groups[this.groupOf[i]].members.length}` : ""));
      body.appendChild(tr);
    }
    table.appendChild(body);
    const foot = html("p", { class: "muted small graph-list-count", "data-list-count": hits.length },
      `${Math.min(hits.length, f.shown).toLocaleString("en")} of ${hits.length.toLocaleString("en")} task${hits.length === 1 ? "" : "s"}`);
    this.listBody.replaceChildren(foot, table);
    if (hits.length > f.shown) {
      const more = html("button", { type: "button", class: "button small outline", "data-list-more": "" },
        `Show ${Math.min(LIST_PAGE, hits.length - f.shown)} more`);
      more.addEventListener("click", () => { f.shown += LIST_PAGE; this.renderRows(); });
      this.listBody.appendChild(more);
    }
    this.listBody.querySelectorAll("a[data-panel-url]").forEach((a) => a.addEventListener("click", (ev) => {
      if (!window.htmx) return;
      ev.preventDefault();
      window.htmx.ajax("GET", a.dataset.panelUrl, { target: "#task-panel", swap: "innerHTML show:#task-panel:top" });
    }));
  }
}

function start() {
  document.querySelectorAll("[data-graph]").forEach((root) => {
    if (root.ffGraph) return;
    try {
      root.ffGraph = new Graph(root);
    } catch (e) {
      root.dataset.error = String(e);
      throw e;
    }
  });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
