/* The home page and the run list, live (issue 20; frontend/live_org.py): the page holds an
 * EventSource on the organization's run-change stream (/live/runs/stream/?since=<instant
 * its data was read>). Each `change` makes it fetch its fragment (#org-live's
 * data-fragment-url) and swap the region named by data-region-name: a fragment, never the
 * whole page. One fetch at a time; changes meanwhile fold into one more. If the stream is
 * refused (429) or unsupported, the page polls its fragment every 5 s instead.
 * `flowforge:org-updated` is dispatched after each swap (detail: {at: Date.now()}).
 * Runs' state changes come over the stream; their progress bars (task counts) change with
 * every task, which the stream does not announce: while the region shows a running run,
 * the fragment is also fetched every PROGRESS_MS.
 */
(function () {
  "use strict";
  var root = document.getElementById("org-live");
  if (!root) return;
  var regionName = root.dataset.regionName;
  var fragmentUrl = root.dataset.fragmentUrl;
  var POLL_MS = 5000;
  var PROGRESS_MS = 10000;
  var inFlight = false, again = false, source = null;

  function setStatus(text, cls) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
      el.className = "live-indicator" + (cls ? " " + cls : "");
    });
  }

  function apply(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var frag = doc.querySelector("[data-live-fragment]");
    var dst = document.querySelector('[data-region="' + regionName + '"]');
    if (!frag || !dst) return;
    dst.replaceChildren.apply(dst, Array.prototype.map.call(frag.childNodes, function (n) {
      return document.importNode(n, true);
    }));
    if (frag.dataset.since) root.dataset.since = frag.dataset.since;
    if (window.FlowForgeClock) window.FlowForgeClock.tick();
    document.dispatchEvent(new CustomEvent("flowforge:org-updated", { detail: { at: Date.now() } }));
  }

  function refresh() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    fetch(fragmentUrl, { credentials: "same-origin", cache: "no-store",
                         headers: { "Accept": "text/html", "X-Requested-With": "fetch" } })
      .then(function (resp) { if (!resp.ok) throw new Error("fragment " + resp.status); return resp.text(); })
      .then(apply)
      .catch(function () { setStatus("Reconnecting…", "stale"); })
      .then(function () { inFlight = false; if (again) { again = false; refresh(); } });
  }

  function poll() { refresh(); setTimeout(poll, POLL_MS); }

  setInterval(function () {
    var region = document.querySelector('[data-region="' + regionName + '"]');
    if (source && region && region.querySelector("tr.run-row.state-running")) refresh();
  }, PROGRESS_MS);

  if (!("EventSource" in window)) { poll(); return; }
  source = new EventSource(root.dataset.streamUrl + "?since=" + encodeURIComponent(root.dataset.since));
  source.addEventListener("open", function () { setStatus("Live"); });
  source.addEventListener("change", refresh);
  source.addEventListener("end", function () { if (source) { source.close(); source = null; } setStatus("Not live", "stale"); });
  var failures = 0;
  source.addEventListener("open", function () { failures = 0; });
  source.addEventListener("error", function () {
    failures += 1;
    // Refused (CLOSED), or failing again and again without opening: poll instead.
    if (source && (source.readyState === EventSource.CLOSED || failures >= 2)) {
      source.close();
      source = null;
      setStatus("Live (polling)", "polling");
      poll();
    } else {
      setStatus("Reconnecting…", "stale");
    }
  });
})();
