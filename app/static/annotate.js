// The ranking page: drag-and-drop and keyboard ordering into tiers, drafts that survive reloads,
// and HTMX submit that keeps the ranking on screen when anything fails. No inline script (CSP).
(function () {
  "use strict";

  function draftKey(form) { return "preflab:draft:" + form.dataset.assignment; }

  function setup(root) {
    var form = root.querySelector("#ranking-form");
    if (!form || form.dataset.ready) return;
    form.dataset.ready = "1";
    var ranked = form.querySelector("#ranked");
    var unranked = form.querySelector("#unranked");
    var k = form.querySelectorAll(".resp").length;
    var allowPartial = form.dataset.allowPartial === "true";
    var allowTies = form.dataset.allowTies === "true";
    var errorBox = form.querySelector("#submit-error");
    var status = form.querySelector("#rank-status");
    var lastButton = null;

    // Time on task counts only while the page is visible.
    var visibleMs = 0, since = document.hidden ? null : performance.now();
    document.addEventListener("visibilitychange", function () {
      if (document.hidden && since !== null) { visibleMs += performance.now() - since; since = null; }
      else if (!document.hidden && since === null) { since = performance.now(); }
    });
    function secondsSpent() { return (visibleMs + (since === null ? 0 : performance.now() - since)) / 1000; }

    function cards(list) { return Array.prototype.slice.call(list.querySelectorAll(":scope > .resp")); }
    function byId(cid) { return form.querySelector('.resp[data-cid="' + cid + '"]'); }

    function sync(save) {
      var tier = 0;
      cards(ranked).forEach(function (li, i) {
        if (i === 0 || !allowTies || li.dataset.tie !== "true") li.dataset.tie = "false";
        if (i > 0 && li.dataset.tie !== "true") tier += 1;
        li.querySelector("select").value = String(tier + 1);
        li.querySelector(".rank-badge").textContent = (li.dataset.tie === "true" ? "= " : "") + "#" + (tier + 1);
        li.setAttribute("aria-label", li.getAttribute("aria-label").split(",")[0] + ", rank " + (tier + 1) +
          (li.dataset.tie === "true" ? ", tied with the one above" : ""));
      });
      cards(unranked).forEach(function (li) {
        li.dataset.tie = "false";
        li.querySelector("select").value = "";
        li.querySelector(".rank-badge").textContent = "";
        li.setAttribute("aria-label", li.getAttribute("aria-label").split(",")[0] + ", not ranked");
      });
      var n = cards(ranked).length;
      status.textContent = n + " of " + k + " ranked" + (n < k && !allowPartial ? " — rank every response to submit" : "");
      form.classList.toggle("complete", n === k);
      if (save !== false) saveDraft();
    }

    function fromSelects() {
      var entries = cards(ranked).concat(cards(unranked)).map(function (li) {
        return { li: li, rank: parseInt(li.querySelector("select").value, 10) };
      });
      var placed = entries.filter(function (e) { return !isNaN(e.rank); }).sort(function (a, b) { return a.rank - b.rank; });
      var prev = null;
      placed.forEach(function (e) {
        e.li.dataset.tie = prev !== null && prev === e.rank ? "true" : "false";
        prev = e.rank;
        ranked.appendChild(e.li);
      });
      entries.filter(function (e) { return isNaN(e.rank); }).forEach(function (e) { unranked.appendChild(e.li); });
      sync();
    }

    function saveDraft() {
      try {
        var draft = { ranked: cards(ranked).map(function (li) { return [li.dataset.cid, li.dataset.tie === "true"]; }),
                      flags: Array.prototype.map.call(form.querySelectorAll("input[type=checkbox][name^=flag_]:checked"),
                                                      function (c) { return [c.name, c.value]; }) };
        localStorage.setItem(draftKey(form), JSON.stringify(draft));
      } catch (e) { /* private mode: the server-rendered form still works */ }
    }

    function restoreDraft() {
      var raw = null;
      try { raw = localStorage.getItem(draftKey(form)); } catch (e) { return false; }
      if (!raw) return false;
      var draft = JSON.parse(raw);
      (draft.ranked || []).forEach(function (item) {
        var li = byId(item[0]);
        if (li) { li.dataset.tie = item[1] ? "true" : "false"; ranked.appendChild(li); }
      });
      (draft.flags || []).forEach(function (f) {
        var box = form.querySelector('input[name="' + f[0] + '"][value="' + CSS.escape(f[1]) + '"]');
        if (box) box.checked = true;
      });
      return true;
    }

    function place(li, position) {
      li.dataset.tie = "false";
      var list = cards(ranked).filter(function (c) { return c !== li; });
      var target = list[Math.min(position, list.length)];
      ranked.insertBefore(li, target || null);
    }

    form.addEventListener("keydown", function (ev) {
      var li = ev.target;
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
        ev.preventDefault();
        form.requestSubmit(form.querySelector("#submit-btn"));
        return;
      }
      if (!li.classList || !li.classList.contains("resp")) return;  // keys inside selects and checkboxes act normally
      var inRanked = li.parentNode === ranked;
      var handled = true;
      if (/^[1-9]$/.test(ev.key) && parseInt(ev.key, 10) <= k) {
        place(li, parseInt(ev.key, 10) - 1);
      } else if (ev.key === "ArrowUp" || ev.key === "ArrowDown") {
        var list = cards(li.parentNode), i = list.indexOf(li);
        var j = ev.key === "ArrowUp" ? i - 1 : i + 1;
        if (!inRanked) {  // in the pool the arrows only move the focus
          ev.preventDefault();
          if (j >= 0 && j < list.length) list[j].focus();
          return;
        }
        if (j >= 0 && j < list.length) {
          li.dataset.tie = "false";
          ranked.insertBefore(li, ev.key === "ArrowUp" ? list[j] : list[j].nextSibling);
        }
      } else if (ev.key === "=" && inRanked && allowTies && cards(ranked).indexOf(li) > 0) {
        li.dataset.tie = li.dataset.tie === "true" ? "false" : "true";
      } else if ((ev.key === "0" || ev.key === "Backspace" || ev.key === "Delete") && inRanked) {
        li.dataset.tie = "false";
        unranked.appendChild(li);
      } else {
        handled = false;
      }
      if (handled) { ev.preventDefault(); sync(); li.focus(); }
    });

    form.addEventListener("change", function (ev) {
      if (ev.target.tagName === "SELECT" && ev.target.name.indexOf("rank_") === 0) fromSelects();
      else saveDraft();
    });
    form.addEventListener("click", function (ev) {
      var b = ev.target.closest("button[type=submit]");
      if (b) lastButton = b;
    });

    // Check before HTMX sends: a full ranking is needed unless the project allows partial ones.
    form.addEventListener("htmx:beforeRequest", function (ev) {
      form.querySelector("input[name=seconds_spent]").value = secondsSpent().toFixed(1);
      var skipping = lastButton && lastButton.value === "skip";
      var n = cards(ranked).length;
      var tiers = new Set(cards(ranked).map(function (li) { return li.querySelector("select").value; })).size;
      var problem = null;
      if (!skipping && !allowPartial && n < k) problem = "Rank every response before you submit (" + n + " of " + k + " ranked).";
      else if (!skipping && tiers < 2) problem = "Put at least two responses in different places.";
      if (problem) { ev.preventDefault(); showError(problem); return; }
      errorBox.hidden = true;
    });
    form.addEventListener("submit", function () {
      form.querySelector("input[name=seconds_spent]").value = secondsSpent().toFixed(1);
    });
    form.addEventListener("htmx:afterRequest", function (ev) {
      if (ev.detail.successful) { try { localStorage.removeItem(draftKey(form)); } catch (e) { /* ignore */ } }
    });
    form.addEventListener("htmx:responseError", function (ev) {
      var message = "The server refused this submission.";
      try {
        var body = JSON.parse(ev.detail.xhr.responseText);
        if (body.detail && body.detail.length) {
          message = body.detail.map(function (d) { return (d.field ? d.field + ": " : "") + d.message; }).join(" ");
        } else if (typeof body.detail === "string") { message = body.detail; }
      } catch (e) { /* not JSON */ }
      showError(message + " Your ranking is kept.");
    });
    form.addEventListener("htmx:sendError", function () {
      showError("Could not reach the server. Your ranking is kept here and saved in this browser; submit again when you are back online.");
    });
    function showError(text) { errorBox.textContent = text; errorBox.hidden = false; errorBox.focus(); }
    errorBox.setAttribute("tabindex", "-1");

    var mono = form.querySelector("#mono-toggle");
    try { mono.checked = localStorage.getItem("preflab:mono") === "1"; } catch (e) { /* ignore */ }
    form.classList.toggle("mono", mono.checked);
    mono.addEventListener("change", function () {
      form.classList.toggle("mono", mono.checked);
      try { localStorage.setItem("preflab:mono", mono.checked ? "1" : "0"); } catch (e) { /* ignore */ }
    });

    if (window.Sortable) {
      // forceFallback: pointer events instead of native HTML5 drag, the same on mouse, pen and touch.
      var opts = { group: "responses", animation: 120, draggable: ".resp", filter: "select, input, summary, label",
                   forceFallback: true, fallbackTolerance: 3,
                   preventOnFilter: false, onEnd: function (evt) { evt.item.dataset.tie = "false"; sync(); } };
      window.Sortable.create(ranked, opts);
      window.Sortable.create(unranked, opts);
    }

    if (!restoreDraft()) { fromSelects(); } else { sync(); }
    sync(false);
    var flash = root.querySelector("#flash");
    var first = cards(unranked)[0] || cards(ranked)[0];
    if (flash && first) first.focus({ preventScroll: true });
  }

  function init(el) { setup(el && el.querySelector ? el : document); }
  document.addEventListener("DOMContentLoaded", function () { init(document); });
  document.addEventListener("htmx:afterSettle", function (ev) { init(ev.detail.elt || document); });
})();
