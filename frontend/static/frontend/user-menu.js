/* FlowForge: the header's user menu (details.user-menu) as a disclosure menu.
 * Loaded on every page from base.html (script-src 'self': no inline script). Without it the
 * <details> element still opens and closes by a click on its button; with it:
 *  - Escape closes it and puts the focus back on its button (the <summary>);
 *  - a click outside it closes it;
 *  - the focus leaving it (Tab past "Sign out", Shift+Tab before its button) closes it, so it
 *    never covers the element the focus went to.
 * tests/e2e/test_browser_user_menu.py.
 */
(function () {
  "use strict";

  function init(menu) {
    var button = menu.querySelector("summary");
    if (!button) return;

    document.addEventListener("keydown", function (event) {
      if (event.key !== "Escape" || !menu.open) return;
      menu.open = false;
      button.focus();
      event.preventDefault();
    });

    document.addEventListener("click", function (event) {
      if (menu.open && !menu.contains(event.target)) menu.open = false;
    });

    // relatedTarget is where the focus went: null when it left for no element (the window
    // lost the focus, or a click on text of the menu), which keeps the menu open.
    menu.addEventListener("focusout", function (event) {
      if (menu.open && event.relatedTarget && !menu.contains(event.relatedTarget)) menu.open = false;
    });
  }

  function start() { document.querySelectorAll("details.user-menu").forEach(init); }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
