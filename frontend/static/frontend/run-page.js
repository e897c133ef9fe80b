/* The run page: live updates while the run is active (frontend/live.py), and a
 * confirmation before cancelling. No inline scripts: the CSP allows only this site's.
 *
 * While the run is active the page holds an EventSource on /runs/<id>/stream/. Each
 * `change` message (the run's latest event seq) makes the client fetch what changed
 * (/runs/<id>/live/?after=<seq>&sig=<the task table page's signature> plus the table's
 * filter): the summary (replaced), the graph's states (a letter a task, which the
 * drawing, frontend/graph/graph.js, recolours itself from: never laid out again), the changed rows of the task table's page and of the
 * timeline (patched by task key) — or the table and timeline whole when the page's rows
 * changed — and the new event rows (appended). One fetch at a time; changes that arrive
 * meanwhile are folded into one more fetch. `end` (the run is terminal) closes the
 * stream after a last fetch, so nothing reconnects. If the stream cannot be opened at
 * all, the client polls every 2 s instead.
 *
 * Between updates time goes on: live-clock.js advances every `data-started` duration
 * each second, and on its tick this script redraws the timeline's bars and axis from
 * their start/end instants (data-start / data-end, epoch ms) and the chart's origin
 * (svg data-t0), so a running bar grows without any request.
 *
 * A task's key in the task table opens its panel (/runs/<id>/tasks/<task run id>/) in
 * #task-panel through htmx; the panel refreshes itself every 2 s until its task finishes
 * (hx-trigger on the panel), independently of the stream.
 */
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  // A link to a task's row (the graph's nodes: "#task-<key>") whose row is on another page of
  // the task table, or filtered out: show the table filtered by that key instead.
  document.addEventListener("click", function (event) {
    var link = event.target instanceof Element ? event.target.closest('a[href^="#task-"]') : null;
    if (!link) return;
    var id = decodeURIComponent(link.getAttribute("href").slice(1));
    if (document.getElementById(id)) return;
    event.preventDefault();
    window.location.assign("?task_key=" + encodeURIComponent(id.slice("task-".length)) + "#" + id);
  });

  var root = document.getElementById("run-live");
  if (!root || root.dataset.terminal === "1") return;

  var fragmentUrl = root.dataset.fragmentUrl;
  var streamUrl = root.dataset.streamUrl;
  var seq = Number(root.dataset.seq) || 0;
  document.querySelectorAll("[data-region='run-events'] tr[data-seq]").forEach(function (row) {
    seq = Math.max(seq, Number(row.dataset.seq) || 0);
  });
  var POLL_MS = 2000;
  var MAX_STREAM_FAILURES = 2;
  var failures = 0;
  var MAX_EVENT_ROWS = 1000;
  var inFlight = false;
  var again = false;
  var finished = false;
  var source = null;
  var pollTimer = null;
  document.addEventListener("flowforge:tick", function (e) { if (!finished) layoutTimeline(e.detail.now); });

  function setStatus(text, cls) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
      el.className = "live-indicator" + (cls ? " " + cls : "");
    });
  }

  function adopt(nodes) {
    return Array.prototype.map.call(nodes, function (n) { return document.importNode(n, true); });
  }

  var SVG_NS = "http://www.w3.org/2000/svg";
  // The chart's geometry (frontend/presenters/timeline.py): a bar at least TL_MIN_BAR wide.
  var TL_MIN_BAR = 4;
  var STEPS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];

  function tickLabel(seconds, step) {
    if (step < 1) return seconds.toFixed(1) + "s";
    if (seconds < 60 || step < 60) {
      if (seconds < 60) return Math.round(seconds) + "s";
      var sec = Math.floor(seconds % 60);
      return Math.floor(seconds / 60) + "m" + (sec < 10 ? "0" : "") + sec + "s";
    }
    if (seconds < 3600) return Math.floor(seconds / 60) + "m";
    return (seconds / 3600).toFixed(1).replace(".0", "") + "h";
  }

  /* Redraw the timeline's bars and axis for the time `now` (server clock, ms). */
  function layoutTimeline(now) {
    var svg = document.querySelector("[data-region='run-timeline'] svg.timeline");
    if (!svg || !svg.dataset.t0) return;
    var t0 = Number(svg.dataset.t0);
    var chartX = Number(svg.dataset.chartX), chartEnd = Number(svg.dataset.chartEnd);
    var bars = svg.querySelectorAll(".tl-bar[data-start]");
    var end = svg.dataset.end ? Number(svg.dataset.end) : now;
    bars.forEach(function (b) {
      t0 = Math.min(t0, Number(b.dataset.start));
      end = Math.max(end, b.dataset.end ? Number(b.dataset.end) : now);
    });
    var span = Math.max((end - t0) / 1000, 0.5);
    var scale = (chartEnd - chartX) / span;
    bars.forEach(function (b) {
      var start = Number(b.dataset.start);
      var stop = b.dataset.end ? Number(b.dataset.end) : now;
      var x = Math.min(chartX + (start - t0) / 1000 * scale, chartEnd - TL_MIN_BAR);
      b.setAttribute("x", x.toFixed(2));
      b.setAttribute("width", Math.max(TL_MIN_BAR, (stop - start) / 1000 * scale).toFixed(2));
    });
    var axis = svg.querySelector(".tl-axis");
    if (!axis) return;
    var step = span / 6;
    for (var i = 0; i < STEPS.length; i++) { if (span / STEPS[i] <= 8) { step = STEPS[i]; break; } }
    var height = svg.viewBox && svg.viewBox.baseVal ? svg.viewBox.baseVal.height : 0;
    var parts = [];
    for (var t = 0; t <= span + 1e-9; t += step) {
      var tx = (chartX + t * scale).toFixed(2);
      var line = document.createElementNS(SVG_NS, "line");
      line.setAttribute("class", "tl-grid");
      line.setAttribute("x1", tx); line.setAttribute("x2", tx);
      line.setAttribute("y1", "18"); line.setAttribute("y2", String(height));
      var text = document.createElementNS(SVG_NS, "text");
      text.setAttribute("class", "tl-tick");
      text.setAttribute("x", tx); text.setAttribute("y", "12");
      text.textContent = tickLabel(t, step);
      parts.push(line, text);
    }
    axis.replaceChildren.apply(axis, parts);
  }

  function patchRows(src, selector, container) {
    Array.prototype.forEach.call(src.children, function (fresh) {
      var key = fresh.dataset.taskKey;
      if (!key) return;
      var old = container.querySelector(selector + '[data-task-key="' + CSS.escape(key) + '"]');
      if (old) old.replaceWith(document.importNode(fresh, true));
    });
  }

  function apply(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var frag = doc.querySelector("[data-live-fragment]");
    if (!frag) return;
    frag.querySelectorAll("[data-region]").forEach(function (src) {
      var name = src.dataset.region;
      var dst = document.querySelector('[data-region="' + name + '"]');
      if (!dst) return;
      var mode = src.dataset.mode;
      if (name === "run-events" && mode === "append") {
        Array.prototype.forEach.call(src.children, function (row) {
          if (Number(row.dataset.seq) > seq) {
            var fresh = document.importNode(row, true);
            fresh.classList.add("fresh");
            dst.appendChild(fresh);
          }
        });
        while (dst.children.length > MAX_EVENT_ROWS) dst.removeChild(dst.firstElementChild);
      } else if (mode === "patch" && name === "run-tasks") {
        patchRows(src, "tr", dst);
        if (window.htmx) window.htmx.process(dst);
      } else if (mode === "patch" && name === "run-timeline") {
        var svg = dst.querySelector("svg.timeline");
        if (svg) patchRows(src, "g.tl-row", svg);
      } else {
        dst.replaceChildren.apply(dst, adopt(src.childNodes));
        // The task table's keys open the task panel through htmx attributes: htmx sees
        // nodes it did not insert itself only once told to.
        if (window.htmx) window.htmx.process(dst);
      }
    });
    frag.querySelectorAll("[data-region='run-events'] tr[data-seq]").forEach(function (row) {
      seq = Math.max(seq, Number(row.dataset.seq) || 0);
    });
    seq = Math.max(seq, Number(frag.dataset.seq) || 0);
    root.dataset.seq = String(seq);
    root.dataset.state = frag.dataset.state;
    if (window.FlowForgeClock) window.FlowForgeClock.tick(); else layoutTimeline(Date.now());
    document.dispatchEvent(new CustomEvent("flowforge:run-updated", { detail: { seq: seq, state: frag.dataset.state } }));
    if (frag.dataset.terminal === "1") stop();
  }

  /* The query of the next fetch: the cursor, the table page's signature and its filter. */
  function fragmentQuery() {
    var bar = document.querySelector("[data-region='run-tasks'] [data-table-sig]");
    var q = "?after=" + encodeURIComponent(seq);
    // No chart yet (no attempt had started): without a signature the server sends it whole.
    var chart = document.querySelector("[data-region='run-timeline'] svg.timeline");
    if (bar) {
      if (chart) q += "&sig=" + encodeURIComponent(bar.dataset.tableSig);
      if (bar.dataset.tableQuery) q += "&" + bar.dataset.tableQuery;
    }
    return q;
  }

  function refresh() {
    if (finished) return;
    if (inFlight) { again = true; return; }
    inFlight = true;
    fetch(fragmentUrl + fragmentQuery(), {
      credentials: "same-origin",
      headers: { "Accept": "text/html", "X-Requested-With": "fetch" },
      cache: "no-store"
    }).then(function (resp) {
      if (!resp.ok) throw new Error("fragment " + resp.status);
      return resp.text();
    }).then(apply).catch(function () {
      setStatus("Reconnecting…", "stale");
    }).then(function () {
      inFlight = false;
      if (again) { again = false; refresh(); }
    });
  }

  function stop() {
    finished = true;
    root.dataset.terminal = "1";
    if (source) { source.close(); source = null; }
    if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; }
  }

  function poll() {
    refresh();
    if (!finished) pollTimer = setTimeout(poll, POLL_MS);
  }

  function connect() {
    if (!("EventSource" in window)) { poll(); return; }
    source = new EventSource(streamUrl + "?after=" + encodeURIComponent(seq));
    source.addEventListener("open", function () { setStatus("Live"); });
    source.addEventListener("change", function () { refresh(); });
    source.addEventListener("end", function () {
      if (source) { source.close(); source = null; }
      // The last fetch shows the terminal state; apply() then stops everything.
      again = false;
      if (inFlight) { again = true; } else { refresh(); }
    });
    source.addEventListener("open", function () { failures = 0; });
    source.addEventListener("error", function () {
      if (finished) return;
      failures += 1;
      // The server refused the stream (CLOSED), or it failed MAX_STREAM_FAILURES times in a
      // row without ever opening (a network that drops it: the browser would retry forever
      // while the page stood still): poll instead. A dropped open stream is retried.
      if (source && (source.readyState === EventSource.CLOSED || failures >= MAX_STREAM_FAILURES)) {
        source.close();
        source = null;
        setStatus("Live (polling)", "polling");
        poll();
      } else {
        setStatus("Reconnecting…", "stale");
      }
    });
  }

  connect();
})();
