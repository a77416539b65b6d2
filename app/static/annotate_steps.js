// Step labels on the ranking page (process supervision): each step of a response takes +1 correct, 0 neutral or
// −1 wrong, by click (radios, so a plain POST sends them) or by key; "first error here" marks −1 and leaves the
// steps after it unlabelled. annotate.js owns the ranking and the draft: it asks `preflabSteps.collect` for the
// labels to save and `preflabSteps.apply` to restore them. No inline script or style (CSP).
(function () {
  "use strict";

  var KEY_LABEL = { c: "1", "+": "1", n: "0", w: "-1", "-": "-1" };

  function steps(list) { return Array.prototype.slice.call(list.querySelectorAll(":scope > .step")); }
  function checked(step) { var r = step.querySelector("input[type=radio]:checked"); return r ? r.value : null; }
  function paint(step) {
    var value = checked(step);
    if (value === null) step.removeAttribute("data-label"); else step.dataset.label = value;
  }
  function paintList(list) {
    var wrong = false;
    steps(list).forEach(function (step) {
      paint(step);
      step.classList.toggle("after-error", wrong);
      if (checked(step) === "-1") wrong = true;
    });
  }

  // {completion id: [1 | 0 | -1 | null, …]} for every response with a label, trailing blanks left out.
  function collect(form) {
    var out = {};
    form.querySelectorAll("ol.steps").forEach(function (list) {
      var labels = steps(list).map(function (step) { var v = checked(step); return v === null ? null : parseInt(v, 10); });
      while (labels.length && labels[labels.length - 1] === null) labels.pop();
      if (labels.length) out[list.dataset.cid] = labels;
    });
    return out;
  }

  function apply(form, labels) {
    Object.keys(labels || {}).forEach(function (cid) {
      var list = form.querySelector('ol.steps[data-cid="' + CSS.escape(cid) + '"]');
      if (!list) return;
      steps(list).forEach(function (step, i) {
        var value = labels[cid][i];
        step.querySelectorAll("input[type=radio]").forEach(function (r) {
          r.checked = value !== null && value !== undefined && r.value === String(value);
        });
      });
      paintList(list);
    });
  }

  // The one change event annotate.js listens to (it saves the draft).
  function changed(step) {
    paintList(step.parentNode);
    var radio = step.querySelector("input[type=radio]");
    if (radio) radio.dispatchEvent(new Event("change", { bubbles: true }));
  }
  function setLabel(step, value) {
    step.querySelectorAll("input[type=radio]").forEach(function (r) { r.checked = value !== null && r.value === value; });
  }
  function focusStep(step) {
    if (!step) return;
    var card = step.closest(".resp");
    if (card && !card.classList.contains("open")) card.classList.add("open");
    step.focus();
  }
  function neighbour(step, delta) {
    var all = steps(step.parentNode);
    return all[all.indexOf(step) + delta] || null;
  }

  function onStepKey(ev, step) {
    var key = ev.key;
    if (KEY_LABEL[key] !== undefined) {
      setLabel(step, KEY_LABEL[key]);
      changed(step);
      focusStep(neighbour(step, 1) || step);
    } else if (key === "e") {  // first error here: −1, and nothing after it is labelled
      setLabel(step, "-1");
      for (var next = neighbour(step, 1); next; next = neighbour(next, 1)) setLabel(next, null);
      changed(step);
    } else if (key === "Backspace" || key === "Delete") {
      setLabel(step, null);
      changed(step);
    } else if (key === "j" || key === "ArrowDown") {
      focusStep(neighbour(step, 1) || step);
    } else if (key === "k" || key === "ArrowUp") {
      focusStep(neighbour(step, -1) || step);
    } else {
      return;
    }
    ev.preventDefault();
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.defaultPrevented || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    var form = document.querySelector("#ranking-form");
    if (!form || !ev.target.closest || !form.contains(ev.target)) return;
    var step = ev.target.closest(".step");
    if (step && ev.target === step) { onStepKey(ev, step); return; }
    if (ev.key === "s" && ev.target.classList.contains("resp")) {
      var all = steps(ev.target.querySelector("ol.steps") || document.createElement("ol"));
      var first = all.filter(function (s) { return checked(s) === null; })[0] || all[0];
      if (first) { ev.preventDefault(); focusStep(first); }
    }
  });

  document.addEventListener("click", function (ev) {
    var step = ev.target.closest && ev.target.closest("#ranking-form .step");
    if (!step) return;
    if (!ev.target.closest("label, input")) focusStep(step);
  });
  document.addEventListener("change", function (ev) {
    var step = ev.target.closest && ev.target.closest("#ranking-form .step");
    if (step) paintList(step.parentNode);
  });

  // Before annotate.js sends the ranking: each response's labels run from step 1 with no gap, and cover every
  // step or end at the first −1. A refusal stops the event here, so annotate.js neither sends nor waits.
  var skipping = false;
  document.addEventListener("click", function (ev) {
    var button = ev.target.closest && ev.target.closest("#ranking-form button[type=submit]");
    if (button) skipping = button.value === "skip";
  }, true);
  function problemOf(form) {
    var lists = form.querySelectorAll("ol.steps");
    for (var n = 0; n < lists.length; n++) {
      var values = steps(lists[n]).map(checked);
      var letter = (lists[n].closest(".resp").querySelector(".letter") || {}).textContent || "";
      var end = values.indexOf("-1");
      var upto = end === -1 ? values.length : end + 1;
      var labelled = values.slice(0, upto).filter(function (v) { return v !== null; }).length;
      if (labelled === 0 && end === -1) continue;  // a response left without step labels
      if (labelled < upto) {
        var gap = values.indexOf(null) + 1;
        return "Response " + letter + ": step " + gap + " has no label. Label every step, or mark the first wrong one (e).";
      }
    }
    return null;
  }
  document.addEventListener("htmx:beforeRequest", function (ev) {
    var form = ev.target;
    if (!form || form.id !== "ranking-form" || skipping) return;
    var problem = problemOf(form);
    if (!problem) return;
    ev.preventDefault();
    ev.stopPropagation();
    var box = form.querySelector("#submit-error");
    if (box) { box.textContent = problem; box.hidden = false; box.focus(); }
  }, true);

  function init() {
    document.querySelectorAll("#ranking-form ol.steps").forEach(paintList);
  }
  document.addEventListener("DOMContentLoaded", init);
  document.addEventListener("htmx:afterSettle", init);

  window.preflabSteps = { collect: collect, apply: apply };
})();
