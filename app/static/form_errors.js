// A page shown again with a refusal (templates/_error.html, p[data-refusal]) brings it into view: the message is
// scrolled to the middle of the screen and the field it names takes the focus, marked invalid and described by the
// message, so a click that was refused never looks like a click that did nothing. The ranking page shows its own errors.
(function () {
  "use strict";

  // The form control the refusal names: its API path ("generator.model"), or the last part of it, as a field name,
  // looked for first in the message's own section.
  function controlFor(error) {
    var field = error.dataset.field;
    if (!field) return null;
    var names = [field, field.split(".").pop()];
    var scopes = [error.closest("section, .card, form"), document];
    for (var s = 0; s < scopes.length; s++) {
      if (!scopes[s]) continue;
      for (var n = 0; n < names.length; n++) {
        var found = scopes[s].querySelector('[name="' + CSS.escape(names[n]) + '"]:not([type=hidden])');
        if (found && found.offsetParent !== null) return found;
      }
    }
    return null;
  }

  function bringIntoView(root) {
    var error = (root || document).querySelector("p[data-refusal]:not([hidden])");
    if (!error || error.closest("#ranking-form")) return;
    if (!error.id) error.id = "form-error";
    error.scrollIntoView({ block: "center" });
    var control = controlFor(error);
    if (control) {
      control.setAttribute("aria-invalid", "true");
      var described = (control.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
      if (described.indexOf(error.id) < 0) control.setAttribute("aria-describedby", described.concat(error.id).join(" "));
      control.focus({ preventScroll: true });
    } else if (!document.querySelector("[autofocus]")) {  // a page that focuses its first field keeps that
      error.setAttribute("tabindex", "-1");
      error.focus({ preventScroll: true });
    }
  }

  document.addEventListener("DOMContentLoaded", function () { bringIntoView(document); });
  // After an HTMX form post that came back with a refusal; never after a poll, which would pull the page around.
  document.addEventListener("htmx:afterSettle", function (ev) {
    var config = ev.detail && ev.detail.requestConfig;
    if (config && config.verb && config.verb !== "get") bringIntoView(ev.detail.elt);
  });
}());
