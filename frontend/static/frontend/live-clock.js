/* Durations that advance between live updates (issue 20). Every element with
 * `data-started` (an ISO 8601 instant the server gave) and no `data-finished` shows the
 * time since then, re-written every second in the words the server uses
 * (frontend.presenters.text.human_duration). The server's clock is the reference: a page
 * gives its server time as `data-now-ms` on #run-live or #org-live, and the difference to
 * this browser's clock is applied, so a skewed client clock shows the right duration.
 * window.FlowForgeClock.now() is that corrected time (run-page.js draws running bars with it).
 */
(function () {
  "use strict";
  var offset = 0;
  var anchor = document.querySelector("#run-live[data-now-ms], #org-live[data-now-ms]");
  if (anchor) offset = Number(anchor.dataset.nowMs) - Date.now();

  function now() { return Date.now() + offset; }

  var NBSP = "\u00a0";  /* a number and its unit never wrap apart, as on the server */
  function human(seconds) {
    seconds = Math.max(0, seconds);
    if (seconds < 1) return Math.round(seconds * 1000) + NBSP + "ms";
    if (seconds < 60) return seconds.toFixed(1) + NBSP + "s";
    if (seconds < 3600) {
      var m = Math.floor(seconds / 60), s = Math.floor(seconds % 60);
      return m + NBSP + "m " + (s < 10 ? "0" : "") + s + NBSP + "s";
    }
    var h = Math.floor(seconds / 3600), mm = Math.floor((seconds % 3600) / 60);
    return h + NBSP + "h " + (mm < 10 ? "0" : "") + mm + NBSP + "m";
  }

  function tick() {
    var t = now();
    document.querySelectorAll("[data-started]:not([data-finished])").forEach(function (el) {
      var start = Date.parse(el.dataset.started);
      if (!isNaN(start)) el.textContent = human((t - start) / 1000);
    });
    document.dispatchEvent(new CustomEvent("flowforge:tick", { detail: { now: t } }));
  }

  window.FlowForgeClock = { now: now, human: human, tick: tick };
  tick();
  setInterval(tick, 1000);
})();
