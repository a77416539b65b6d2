// The run page's log panel follows the end of the log, like `tail -f`: it starts scrolled to the bottom and stays
// there on every HTMX poll, unless the reader scrolled up to read, in which case it keeps their place.
// No inline script or style (CSP: script-src 'self'); the panel is #run-log inside the polled #live section.
(function () {
  "use strict";
  var NEAR_END_PX = 8;
  var kept = null; // {atEnd, top} of the panel just before a poll replaces it

  function panel() { return document.getElementById("run-log"); }

  function atEnd(el) { return el.scrollHeight - el.scrollTop - el.clientHeight <= NEAR_END_PX; }

  function toEnd() {
    var el = panel();
    if (el) { el.scrollTop = el.scrollHeight; }
  }

  document.addEventListener("DOMContentLoaded", toEnd);
  document.addEventListener("htmx:beforeSwap", function (event) {
    var el = panel();
    if (el && event.target && event.target.id === "live") {
      kept = { atEnd: atEnd(el), top: el.scrollTop, focused: document.activeElement === el };
    }
  });
  function restore() {
    var el = panel();
    if (!el || kept === null) { return; }
    if (kept.atEnd) { el.scrollTop = el.scrollHeight; } else { el.scrollTop = kept.top; }
    if (kept.focused && document.activeElement !== el) { el.focus({ preventScroll: true }); }
  }

  // At once after the swap (no frame at the top of the log), and again once htmx has settled the new content.
  document.addEventListener("htmx:afterSwap", restore);
  document.addEventListener("htmx:afterSettle", function () { restore(); kept = null; });
}());
