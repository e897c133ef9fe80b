/* FlowForge: small behaviours of the workflow, trigger and API-key pages.
 * Loaded from static with the CSP nonce; no inline script anywhere.
 *  - textarea[data-json-object]: checks as you type that the text is a JSON object and
 *    blocks the submit with the message next to the field (the server checks it again).
 *  - input[data-confirm-name]: its form's submit button is enabled only once the typed
 *    text equals the name.
 *  - button[data-copy-target]: copies the target's value (or text) to the clipboard.
 *  - input[data-live-preview]: a field whose live preview (the element of that id, updated by
 *    htmx as it is typed) checks it: once it is edited, the server's error under it, about the
 *    text sent before, is hidden and the field no longer marked invalid; the preview speaks.
 */
(function () {
  "use strict";

  function jsonProblem(text) {
    if (!text.trim()) return "";
    var value;
    try { value = JSON.parse(text); } catch (e) { return "Not valid JSON: " + e.message; }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      return 'Must be a JSON object, such as {"limit": 10}.';
    }
    return "";
  }

  function statusFor(field) {
    var id = field.id + "_client_error";
    var el = document.getElementById(id);
    if (!el) {
      el = document.createElement("p");
      el.id = id;
      el.className = "errorlist client-error";
      el.setAttribute("aria-live", "polite");
      field.insertAdjacentElement("afterend", el);
    }
    return el;
  }

  function checkJson(field) {
    var problem = jsonProblem(field.value);
    field.setCustomValidity(problem);
    var el = statusFor(field);
    el.textContent = problem;
    el.hidden = !problem;
    if (problem) field.setAttribute("aria-invalid", "true"); else field.removeAttribute("aria-invalid");
    return !problem;
  }

  function initJson(root) {
    root.querySelectorAll("textarea[data-json-object]").forEach(function (field) {
      field.addEventListener("input", function () { checkJson(field); });
      var form = field.form;
      if (form && !form.dataset.jsonChecked) {
        form.dataset.jsonChecked = "1";
        form.addEventListener("submit", function (event) {
          var ok = true;
          form.querySelectorAll("textarea[data-json-object]").forEach(function (f) { ok = checkJson(f) && ok; });
          if (!ok) { event.preventDefault(); form.querySelector("[aria-invalid=true]").focus(); }
        });
      }
    });
  }

  function initConfirm(root) {
    root.querySelectorAll("input[data-confirm-name]").forEach(function (input) {
      var button = input.form && input.form.querySelector("button[type=submit]");
      if (!button) return;
      var update = function () { button.disabled = input.value.trim() !== input.dataset.confirmName; };
      input.addEventListener("input", update);
      update();
    });
  }

  function initCopy(root) {
    root.querySelectorAll("button[data-copy-target]").forEach(function (button) {
      button.addEventListener("click", function () {
        var target = document.querySelector(button.dataset.copyTarget);
        if (!target) return;
        var text = "value" in target ? target.value : target.textContent;
        var label = button.textContent;
        var done = function (ok) {
          button.textContent = ok ? (button.dataset.copiedText || "Copied") : "Press Ctrl+C to copy";
          button.classList.toggle("copied", ok);
          window.setTimeout(function () { button.textContent = label; button.classList.remove("copied"); }, 2000);
        };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(function () { done(true); }, function () { select(target); done(false); });
        } else {
          select(target);
          done(false);
        }
      });
    });
    root.querySelectorAll("[data-select-on-focus]").forEach(function (input) {
      input.addEventListener("focus", function () { select(input); });
    });
  }

  function initLivePreview(root) {
    root.querySelectorAll("input[data-live-preview]").forEach(function (field) {
      var errors = document.getElementById(field.id + "_errors");
      if (!errors) return;
      field.addEventListener("input", function () {
        errors.hidden = true;
        field.removeAttribute("aria-invalid");
        var wrap = field.closest(".has-error");
        if (wrap) wrap.classList.remove("has-error");
      });
    });
  }

  function select(target) {
    if (target.select) { target.focus(); target.select(); }
  }

  function init(root) { initJson(root); initConfirm(root); initCopy(root); initLivePreview(root); }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { init(document); });
  } else {
    init(document);
  }
})();
