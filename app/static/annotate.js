// The ranking page: keyboard and drag-and-drop ordering into tiers, drafts that survive reloads and follow the
// annotator to another device, and HTMX submit that keeps the ranking on screen when anything fails. No inline
// script and no style attributes (CSP): layout state lives in classes and the `hidden`/`open` attributes.
(function () {
  "use strict";

  // Controls inside a card stay out of the Tab order (Tab goes card to card); Enter on a card lets them in.
  var CARD_CONTROLS = "select, input, summary, button";
  var COLLAPSED_LINES = 4;  // keep in step with .resp:not(.open) .resp-body in preflab.css
  // Drafts: kept in localStorage at once, and on the server (PUT /api/v1/assignments/{id}/draft) after a pause in the
  // ranking, so one request per burst of keys; when the server cannot be reached it is tried again, backing off.
  var DRAFT_PUT_DELAY_MS = 800;
  var DRAFT_RETRY_MS = [2000, 5000, 15000, 30000];
  var current = null;  // the controller of the form on screen; HTMX swaps in a new one per task

  function load(key) { try { return localStorage.getItem(key); } catch (e) { return null; } }
  function store(key, value) { try { localStorage.setItem(key, value); } catch (e) { /* private mode */ } }
  function forget(key) { try { localStorage.removeItem(key); } catch (e) { /* private mode */ } }
  function draftKey(form) { return "preflab:draft:" + form.dataset.assignment; }

  // A draft is {tiers: [[cid, …], …] best first, flags: {cid: [flag, …]}, seconds_spent, edited_at (ms),
  // synced (the server holds it)}. Drafts stored before server drafts read as never synced, edited at 0.
  function parseDraft(raw) {
    if (!raw) return null;
    var d;
    try { d = JSON.parse(raw); } catch (e) { return null; }
    if (!d || !d.ranked) return d;
    var tiers = [], flags = {};
    d.ranked.forEach(function (item, i) {
      if (i === 0 || !item[1]) tiers.push([]);
      tiers[tiers.length - 1].push(parseInt(item[0], 10));
    });
    (d.flags || []).forEach(function (f) { var cid = f[0].slice(5); (flags[cid] = flags[cid] || []).push(f[1]); });
    return { tiers: tiers, flags: flags, edited_at: 0, synced: false };
  }
  function serverDraft(form) {
    var d = parseDraft(form.dataset.draft);
    if (d) { d.edited_at = Date.parse(d.edited_at) || 0; d.synced = true; }
    return d;
  }
  // Whether a failed PUT may succeed later: not when the task is gone (404), a newer draft is saved (409), or the
  // draft or the session is refused (4xx); yes when offline, rate-limited or the server is busy.
  function worthRetrying(status) { return status === 0 || status === 429 || status >= 500; }
  function typing(el) { return el && el.matches && el.matches("input:not([type=checkbox]), textarea, select, [contenteditable]"); }

  function setup(root) {
    var form = root.querySelector("#ranking-form");
    if (!form) { current = document.querySelector("#ranking-form") ? current : null; return; }
    if (form.dataset.ready) return;
    form.dataset.ready = "1";
    var page = form.closest(".annotate");
    var ranked = form.querySelector("#ranked");
    var unranked = form.querySelector("#unranked");
    var k = form.querySelectorAll(".resp").length;
    var allowPartial = form.dataset.allowPartial === "true";
    var allowTies = form.dataset.allowTies === "true";
    var errorBox = form.querySelector("#submit-error");
    var status = form.querySelector("#rank-status");
    var keymap = page.querySelector("#keymap");
    var lastButton = null;
    var draftUrl = "/api/v1/assignments/" + encodeURIComponent(form.dataset.assignment) + "/draft";
    var csrfInput = form.querySelector("input[name=csrf_token]");
    var unsent = null;  // the draft the server does not hold yet
    var putTimer = null, putting = null, putAgain = false, retries = 0, submitting = false;

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

    function fromSelects(save) {
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
      sync(save);
    }

    // --- drafts: this browser first, then the server ---
    function currentDraft() {
      var tiers = [], flags = {};
      cards(ranked).forEach(function (li, i) {
        if (i === 0 || li.dataset.tie !== "true") tiers.push([]);
        tiers[tiers.length - 1].push(parseInt(li.dataset.cid, 10));
      });
      form.querySelectorAll("input[type=checkbox][name^=flag_]:checked").forEach(function (c) {
        var cid = c.name.slice(5);
        (flags[cid] = flags[cid] || []).push(c.value);
      });
      // Step labels (process supervision) live in annotate_steps.js; the draft carries them.
      var steps = window.preflabSteps ? window.preflabSteps.collect(form) : {};
      return { tiers: tiers, flags: flags, step_labels: steps,
               seconds_spent: Math.min(Math.round(secondsSpent() * 10) / 10, 86400), edited_at: Date.now(),
               synced: false };
    }

    function saveDraft() {
      unsent = currentDraft();
      store(draftKey(form), JSON.stringify(unsent));
      retries = 0;
      schedulePut(DRAFT_PUT_DELAY_MS);
    }

    function schedulePut(delay) {
      clearTimeout(putTimer);
      putTimer = setTimeout(putDraft, delay);
    }

    function putDraft(leaving) {
      putTimer = null;
      if (!unsent || submitting || !document.contains(form)) return;
      if (putting) { putAgain = true; return; }  // one request at a time; the newest draft goes next
      var sent = unsent;
      putting = new AbortController();
      fetch(draftUrl, {
        method: "PUT", credentials: "same-origin", keepalive: leaving === true, signal: putting.signal,
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfInput ? csrfInput.value : "" },
        body: JSON.stringify({ tiers: sent.tiers, flags: sent.flags, step_labels: sent.step_labels || {},
                               seconds_spent: sent.seconds_spent, edited_at: new Date(sent.edited_at).toISOString() })
      }).then(function (r) {
        return r.ok ? r.json().then(function (saved) { putDone(sent, saved); }) : putFailed(sent, r.status);
      }).catch(function () { putFailed(sent, 0); }).then(function () {
        putting = null;
        if (putAgain) { putAgain = false; putDraft(); }
      });
    }

    function putDone(sent, saved) {
      retries = 0;
      if (unsent !== sent) return;  // changed again meanwhile: that one is on its way
      unsent = null;
      // The server's clock from now on, so that this draft and one from another device compare fairly.
      sent.edited_at = Date.parse(saved.edited_at) || sent.edited_at;
      sent.synced = true;
      store(draftKey(form), JSON.stringify(sent));
    }

    function putFailed(sent, status) {
      if (unsent !== sent) return;
      if (!worthRetrying(status)) { unsent = null; return; }  // it stays in this browser
      schedulePut(DRAFT_RETRY_MS[Math.min(retries, DRAFT_RETRY_MS.length - 1)]);
      retries += 1;
    }

    function applyDraft(draft) {
      (draft.tiers || []).forEach(function (tier) {
        tier.forEach(function (cid, j) {
          var li = byId(cid);
          if (li) { li.dataset.tie = j > 0 ? "true" : "false"; ranked.appendChild(li); }
        });
      });
      Object.keys(draft.flags || {}).forEach(function (cid) {
        draft.flags[cid].forEach(function (name) {
          var box = form.querySelector('input[name="flag_' + CSS.escape(cid) + '"][value="' + CSS.escape(name) + '"]');
          if (box) box.checked = true;
        });
      });
      if (window.preflabSteps) window.preflabSteps.apply(form, draft.step_labels || {});
      // The clock goes on from where the draft left it, on whichever device.
      if (typeof draft.seconds_spent === "number") visibleMs = Math.max(visibleMs, draft.seconds_spent * 1000);
    }

    // The newer of this browser's draft and the server's (given with the page); one not on the server yet is sent.
    function restoreDraft() {
      var local = parseDraft(load(draftKey(form)));
      var server = serverDraft(form);
      var draft = server && (!local || server.edited_at > local.edited_at) ? server : local;
      if (!draft) return false;
      applyDraft(draft);
      if (draft === server) store(draftKey(form), JSON.stringify(server));
      else if (!draft.synced) { unsent = draft; schedulePut(0); }
      return true;
    }

    function place(li, position) {
      li.dataset.tie = "false";
      var list = cards(ranked).filter(function (c) { return c !== li; });
      var target = list[Math.min(position, list.length)];
      ranked.insertBefore(li, target || null);
    }

    // The unranked card after `li` (or the first one left), for the focus to move to once `li` is placed.
    function nextUnranked(li) {
      var pool = cards(unranked).filter(function (c) { return c !== li; });
      if (li.parentNode !== unranked) return null;
      var after = cards(unranked).slice(cards(unranked).indexOf(li) + 1);
      return after[0] || pool[0] || null;
    }

    // --- controls inside a card: out of the Tab order until Enter, back out when the focus leaves the card ---
    function controls(li) {
      return Array.prototype.filter.call(li.querySelectorAll(CARD_CONTROLS), function (el) { return !el.closest("[hidden]"); });
    }
    function lockControls(li) { li.querySelectorAll(CARD_CONTROLS).forEach(function (el) { el.tabIndex = -1; }); }
    function unlockControls(li) {
      li.querySelectorAll(CARD_CONTROLS).forEach(function (el) { el.removeAttribute("tabindex"); });
      var first = controls(li)[0];
      if (first) first.focus();
    }

    // --- long answers: a few lines until the card has the focus or "Show all" is pressed ---
    function paintShowAll(li) {
      var b = li.querySelector(".show-all");
      var open = li.classList.contains("open");
      b.textContent = open ? "Show less" : "Show all";
      b.setAttribute("aria-expanded", open ? "true" : "false");
    }
    function measure() {
      form.querySelectorAll(".resp").forEach(function (li) {
        var body = li.querySelector(".resp-body");
        var line = parseFloat(getComputedStyle(body).lineHeight) || 20;
        li.classList.toggle("long", body.scrollHeight > line * COLLAPSED_LINES + 4);
        li.querySelector(".show-all").hidden = !li.classList.contains("long");
        paintShowAll(li);
      });
    }
    // Long answers open where the keyboard is: on the card the focus moves to by key (focus events do not fire while
    // the window lacks focus, so the key paths call this themselves). A mouse or a finger changes nothing by focusing:
    // a card collapsing under the pointer would move the one being grabbed.
    function openOnly(li) {
      form.querySelectorAll(".resp.open").forEach(function (c) {
        if (c !== li && c.dataset.pinned !== "true") { c.classList.remove("open"); paintShowAll(c); }
      });
      if (li.dataset.closedByHand !== "true") { li.classList.add("open"); paintShowAll(li); }
    }
    function focusCard(li, options) { li.focus(options); openOnly(li); }
    form.addEventListener("focusin", function (ev) {
      var li = ev.target.closest(".resp");
      if (li && ev.target === li && li.matches(":focus-visible")) openOnly(li);
    });
    form.addEventListener("focusout", function (ev) {
      var li = ev.target.closest(".resp");
      if (!li || (ev.relatedTarget && li.contains(ev.relatedTarget))) return;
      lockControls(li);
      delete li.dataset.closedByHand;
    });

    function onCardKey(ev, li) {
      var inRanked = li.parentNode === ranked;
      var after = li;
      if (/^[1-9]$/.test(ev.key) && parseInt(ev.key, 10) <= k) {
        after = nextUnranked(li) || li;
        place(li, parseInt(ev.key, 10) - 1);
      } else if (ev.key === "ArrowUp" || ev.key === "ArrowDown") {
        var list = cards(li.parentNode), i = list.indexOf(li);
        var j = ev.key === "ArrowUp" ? i - 1 : i + 1;
        if (!inRanked) {  // in the pool the arrows only move the focus
          if (j >= 0 && j < list.length) after = list[j];
        } else if (j >= 0 && j < list.length) {
          li.dataset.tie = "false";
          ranked.insertBefore(li, ev.key === "ArrowUp" ? list[j] : list[j].nextSibling);
        }
      } else if (ev.key === "=" && inRanked && allowTies && cards(ranked).indexOf(li) > 0) {
        li.dataset.tie = li.dataset.tie === "true" ? "false" : "true";
      } else if (ev.key === "=" && !inRanked && allowTies) {
        // Not ranked yet: "tie with the card above" ranks it last, tied with the last ranked card (if any).
        after = nextUnranked(li) || li;
        var tied = cards(ranked).length > 0;
        ranked.appendChild(li);
        li.dataset.tie = tied ? "true" : "false";
      } else if ((ev.key === "0" || ev.key === "Backspace" || ev.key === "Delete") && inRanked) {
        li.dataset.tie = "false";
        unranked.appendChild(li);
      } else if (ev.key === "Enter" && !ev.ctrlKey && !ev.metaKey) {
        ev.preventDefault();
        unlockControls(li);
        return;
      } else {
        return;
      }
      ev.preventDefault();
      sync();
      focusCard(after);
    }

    function toggleRubric() { if (rubric) rubric.open = !rubric.open; }
    function showKeys() { if (keymap && !keymap.open) keymap.showModal(); }

    function onKey(ev) {
      if (ev.defaultPrevented || ev.altKey) return;
      if (keymap && keymap.contains(ev.target)) {
        if (ev.key === "?") { ev.preventDefault(); keymap.close(); }
        return;  // Escape closes the dialog natively
      }
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
        ev.preventDefault();
        form.requestSubmit(form.querySelector("#submit-btn"));
        return;
      }
      if (ev.ctrlKey || ev.metaKey) return;
      var li = ev.target.closest && ev.target.closest(".resp");
      if (li && ev.target !== li && ev.key === "Escape") { ev.preventDefault(); lockControls(li); li.focus(); return; }
      if (typing(ev.target)) return;  // keys inside selects and text fields act normally
      if (ev.key === "?") { ev.preventDefault(); showKeys(); return; }
      if (ev.key === "r" && (!li || ev.target === li)) { ev.preventDefault(); toggleRubric(); return; }
      if (li && ev.target === li && form.contains(li)) onCardKey(ev, li);
    }

    form.addEventListener("change", function (ev) {
      if (ev.target.tagName === "SELECT" && ev.target.name.indexOf("rank_") === 0) fromSelects();
      else if (ev.target.name && (ev.target.name.indexOf("flag_") === 0 || ev.target.name.indexOf("step_") === 0)) {
        saveDraft();
      }
    });
    form.addEventListener("click", function (ev) {
      var b = ev.target.closest("button[type=submit]");
      if (b) lastButton = b;
      var more = ev.target.closest(".show-all");
      if (more) {
        var li = more.closest(".resp");
        var open = !li.classList.contains("open");
        li.classList.toggle("open", open);
        li.dataset.pinned = open ? "true" : "false";
        li.dataset.closedByHand = open ? "false" : "true";
        paintShowAll(li);
      }
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
      // The submit replaces the draft: no save of it may land after (a 404 then) or race it.
      submitting = true;
      clearTimeout(putTimer);
      if (putting) putting.abort();
    });
    form.addEventListener("submit", function () {
      form.querySelector("input[name=seconds_spent]").value = secondsSpent().toFixed(1);
    });
    form.addEventListener("htmx:afterRequest", function (ev) {
      submitting = false;
      if (!ev.detail.successful) { if (unsent) schedulePut(DRAFT_PUT_DELAY_MS); return; }
      // Submitted: the server dropped its copy with the task; this browser's goes too.
      unsent = null;
      clearTimeout(putTimer);
      forget(draftKey(form));
    });
    form.addEventListener("htmx:responseError", function (ev) {
      var message = "The server refused this submission.";
      try {
        var body = JSON.parse(ev.detail.xhr.responseText);
        if (body.detail && body.detail.length) {
          // The field as the page labels it ("" for a hidden one: the message stands alone), never its API path.
          message = body.detail.map(function (d) {
            var name = d.label !== undefined ? d.label : "";
            return (name ? name + ": " : "") + d.message;
          }).join(" ");
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
    mono.checked = load("preflab:mono") === "1";
    form.classList.toggle("mono", mono.checked);
    mono.addEventListener("change", function () {
      form.classList.toggle("mono", mono.checked);
      store("preflab:mono", mono.checked ? "1" : "0");
      measure();
    });

    // The rubric: open on wide screens, a one-line bar on phones, and whatever this user chose last time.
    var rubric = page.querySelector("#rubric-details");
    if (rubric) {
      var rubricKey = "preflab:rubric-open:" + (page.dataset.user || "anonymous");
      var saved = load(rubricKey);
      var shown = saved === null ? !window.matchMedia("(max-width: 900px)").matches : saved === "1";
      rubric.open = shown;
      rubric.addEventListener("toggle", function () {  // also fires for the line above: only a change is stored
        if (rubric.open !== shown) { shown = rubric.open; store(rubricKey, shown ? "1" : "0"); }
      });
    }

    if (keymap) {
      var opener = page.querySelector("#keys-open");
      opener.hidden = false;
      opener.addEventListener("click", showKeys);
      keymap.querySelector("#keys-close").addEventListener("click", function () { keymap.close(); });
    }

    // Where the card is let go decides, not only where Sortable last put it: Sortable moves a card when its timer
    // looks under the pointer (every 50 ms) and the cards there stand still, so a card released soon after it
    // reached the empty strip under a list (or another list) stayed where it was passing. Released below a list's
    // last card, it goes last; released over a list it is not in, it goes to that list's end.
    function dropWhereReleased(evt) {
      var e = evt.originalEvent;
      var at = e && e.changedTouches && e.changedTouches.length ? e.changedTouches[0] : e;
      if (!at || typeof at.clientX !== "number") return;
      [ranked, unranked].forEach(function (list) {
        var box = list.getBoundingClientRect();
        if (at.clientX < box.left || at.clientX > box.right || at.clientY < box.top || at.clientY > box.bottom) return;
        var others = cards(list).filter(function (c) { return c !== evt.item; });
        var last = others[others.length - 1];
        if (!last || at.clientY > last.getBoundingClientRect().bottom || evt.item.parentNode !== list) {
          list.appendChild(evt.item);
        }
      });
    }

    if (window.Sortable) {
      // forceFallback: pointer events instead of native HTML5 drag, the same on mouse, pen and touch. A finger drags
      // by the card's head only (touch-action: none there), so a swipe on the answer text still scrolls the page.
      var opts = { group: "responses", animation: 120, draggable: ".resp", forceFallback: true, fallbackTolerance: 3,
                   preventOnFilter: false,
                   filter: function (evt) {
                     var t = evt.target.closest ? evt.target : evt.target.parentElement;
                     if (t.closest("select, input, summary, label, button")) return true;
                     var touch = evt.pointerType === "touch" || (evt.touches && evt.touches.length > 0);
                     return Boolean(touch) && !t.closest(".resp-head");
                   },
                   onEnd: function (evt) {
                     dropWhereReleased(evt);
                     evt.item.dataset.tie = "false";
                     if (evt.item.dataset.pinned !== "true") { evt.item.classList.remove("open"); paintShowAll(evt.item); }
                     sync();
                   } };
      window.Sortable.create(ranked, opts);
      window.Sortable.create(unranked, opts);
    }

    form.querySelectorAll(".resp").forEach(lockControls);
    // Nothing is saved for what was only restored: a draft's time is its last edit, not its last page load.
    if (!restoreDraft()) fromSelects(false);
    sync(false);
    measure();
    current = { form: form, onKey: onKey, measure: measure,
                sendDraft: function (leaving) { if (unsent) { clearTimeout(putTimer); putDraft(leaving); } } };
    // Focus starts on the first card to rank, so a full ranking is K number keys and Ctrl+Enter.
    var first = cards(unranked)[0] || cards(ranked)[0];
    if (first) focusCard(first, { preventScroll: true });
  }

  function init(el) { setup(el && el.querySelector ? el : document); }
  document.addEventListener("DOMContentLoaded", function () { init(document); });
  document.addEventListener("htmx:afterSettle", function (ev) { init(ev.detail.elt || document); });
  document.addEventListener("keydown", function (ev) {
    if (current && document.contains(current.form)) current.onKey(ev);
  });
  // Back online: the draft waiting for the server goes now. Leaving the page: it goes before the page does.
  window.addEventListener("online", function () { if (current) current.sendDraft(); });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden && current) current.sendDraft(true);
  });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () { if (current) current.measure(); }, 150);
  });
})();
