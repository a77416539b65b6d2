// The training form: the Export list offers only exports of the kind the chosen method reads (the kind option's
// data-export-kind), newest first as the server lists them (choosing the newest, or the one the server marks
// data-preferred: pre-made pairs when the newest is too small), and says when the chosen export is too small to learn
// from. Without this script preflab.css still hides the other kinds' exports and the server's choice stands.
(function () {
  "use strict";

  function setup() {
    var form = document.querySelector(".start-run form");
    if (!form) return;
    var kind = form.querySelector("select[name=kind]");
    var exportSelect = form.querySelector("select[name=export_id]");
    var none = document.getElementById("no-export");
    var warning = document.getElementById("small-data");
    if (!kind || !exportSelect) return;

    function showWarning() {
      var chosen = exportSelect.selectedOptions[0];
      var text = chosen && !chosen.disabled ? chosen.dataset.warning || "" : "";
      warning.textContent = text;
      warning.hidden = !text;
    }

    function offerFitting() {
      var wanted = kind.selectedOptions[0].dataset.exportKind;
      var newest = null;
      Array.prototype.forEach.call(exportSelect.options, function (option) {
        var fits = option.dataset.kind === wanted;
        option.hidden = !fits;
        option.disabled = !fits;
        if (fits && (newest === null || "preferred" in option.dataset)) newest = option;
      });
      var chosen = exportSelect.selectedOptions[0];
      if (!chosen || chosen.disabled) {
        if (newest) newest.selected = true; else exportSelect.selectedIndex = -1;
      }
      if (none) {
        none.hidden = newest !== null;
        document.getElementById("no-export-kind").textContent = wanted;
      }
      showWarning();
    }

    kind.addEventListener("change", offerFitting);
    exportSelect.addEventListener("change", showWarning);
    offerFitting();
  }

  document.addEventListener("DOMContentLoaded", setup);
}());
