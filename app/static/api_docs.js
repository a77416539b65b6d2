// /docs: Swagger UI over the app's own /openapi.json, from the vendored bundle (no CDN, no inline script: CSP).
(function () {
  "use strict";

  // "Try it out" in a logged-in browser sends the session cookie, so a state-changing call needs the CSRF token
  // the page carries for htmx (base.html's hx-headers); a call with a bearer token ignores it.
  function csrfToken() {
    try { return JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRF-Token"] || ""; }
    catch (e) { return ""; }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("swagger-ui");
    if (!root || !window.SwaggerUIBundle) return;
    var token = csrfToken();
    window.SwaggerUIBundle({
      url: root.dataset.spec,
      domNode: root,
      deepLinking: true,
      presets: [window.SwaggerUIBundle.presets.apis],
      layout: "BaseLayout",
      validatorUrl: null,  // the default asks a validator on another host: nothing leaves the app
      requestInterceptor: function (req) {
        if (token) req.headers["X-CSRF-Token"] = token;
        return req;
      }
    });
  });
}());
