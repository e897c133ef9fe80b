/* The run page: live updates while the run is active (frontend/live.py), and a
 * confirmation before cancelling. No inline scripts: the CSP allows only this site's.
 *
 * While the run is active the page holds an EventSource on /runs/<id>/stream/. Each
 * `change` message (the run's latest event seq) makes the client fetch the live
 * fragment (/runs/<id>/live/?after=<seq>) and swap its regions in: summary, graph,
 * timeline and task table are replaced, new event rows are appended. One fetch at a
 * time; changes that arrive meanwhile are folded into one more fetch. `end` (the run
 * is terminal) closes the stream after a last fetch, so nothing reconnects. If the
 * stream cannot be opened at all, the client polls the fragment every 2 s instead.
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

  var root = document.getElementById("run-live");
  if (!root || root.dataset.terminal === "1") return;

  var fragmentUrl = root.dataset.fragmentUrl;
  var streamUrl = root.dataset.streamUrl;
  var seq = Number(root.dataset.seq) || 0;
  document.querySelectorAll("[data-region='run-events'] tr[data-seq]").forEach(function (row) {
    seq = Math.max(seq, Number(row.dataset.seq) || 0);
  });
  var POLL_MS = 2000;
  var MAX_EVENT_ROWS = 1000;
  var inFlight = false;
  var again = false;
  var finished = false;
  var source = null;
  var pollTimer = null;

  function setStatus(text, cls) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
      el.className = "live-indicator" + (cls ? " " + cls : "");
    });
  }

  function adopt(nodes) {
    return Array.prototype.map.call(nodes, function (n) { return document.importNode(n, true); });
  }

  function apply(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var frag = doc.querySelector("[data-live-fragment]");
    if (!frag) return;
    frag.querySelectorAll("[data-region]").forEach(function (src) {
      var name = src.dataset.region;
      var dst = document.querySelector('[data-region="' + name + '"]');
      if (!dst) return;
      if (name === "run-events" && src.dataset.mode === "append") {
        Array.prototype.forEach.call(src.children, function (row) {
          if (Number(row.dataset.seq) > seq) {
            var fresh = document.importNode(row, true);
            fresh.classList.add("fresh");
            dst.appendChild(fresh);
          }
        });
        while (dst.children.length > MAX_EVENT_ROWS) dst.removeChild(dst.firstElementChild);
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
    document.dispatchEvent(new CustomEvent("flowforge:run-updated", { detail: { seq: seq, state: frag.dataset.state } }));
    if (frag.dataset.terminal === "1") stop();
  }

  function refresh() {
    if (finished) return;
    if (inFlight) { again = true; return; }
    inFlight = true;
    fetch(fragmentUrl + "?after=" + encodeURIComponent(seq), {
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
    source.addEventListener("error", function () {
      if (finished) return;
      if (source && source.readyState === EventSource.CLOSED) {
        // The server refused the stream (not a dropped connection, which the browser retries).
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
