// Blame, embedded only in runs whose records carry one: the blame filter over the matrix (cells of
// other parties dimmed, rows without one hidden) and, in a cell's details, the ladder's rungs and
// the first diverging node. Record text only ever goes through textContent.
(function () {
  "use strict";
  var cells = JSON.parse(document.getElementById("cell-data").textContent);
  var title = document.getElementById("d-title");
  var body = document.getElementById("d-body");
  var dialog = document.getElementById("details");
  var form = document.getElementById("filters");
  var select = form.querySelector("select[data-party-filter]");
  var tbody = document.querySelector("#matrix tbody");

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function filter() {
    var party = select ? select.value : "";
    if (!party) {
      tbody.querySelectorAll("td.party-dim").forEach(function (td) { td.classList.remove("party-dim"); });
      return;
    }
    Array.prototype.forEach.call(tbody.rows, function (row) {
      var tds = row.querySelectorAll("td[data-idx]");
      var any = false;
      tds.forEach(function (td) {
        var match = td.dataset.party === party;
        any = any || (match && !td.hidden);
        td.classList.toggle("party-dim", !match);
        td.classList.toggle("dim", !match);
      });
      if (!any) row.hidden = true;
    });
  }
  // after the matrix's own filters (registered first) have run
  form.addEventListener("input", filter);
  form.addEventListener("change", filter);
  form.addEventListener("reset", function () { setTimeout(filter, 0); });

  function render() {
    if (!dialog.open || body.querySelector(".d-blame")) return;
    var c = null;
    for (var i = 0; i < cells.length; i++) {
      if (cells[i].cell_id === title.textContent) { c = cells[i]; break; }
    }
    if (!c || !c.blame) return;
    var b = c.blame;
    var box = el("section", "d-blame");
    box.appendChild(el("h3", null, "Blame"));
    box.appendChild(el("p", "hint", b.party + (b.repository ? " · report to " + b.repository : "") + ": " + b.reason));
    if (b.source) box.appendChild(el("pre", "err", b.source));
    if (b.evidence && b.evidence.length) {
      var t = el("table", "kv");
      var head = el("tr");
      ["rung", "outcome", "detail", "s"].forEach(function (h) { head.appendChild(el("th", null, h)); });
      t.appendChild(head);
      b.evidence.forEach(function (r) {
        var row = el("tr");
        [r.rung, r.outcome, r.detail || "", r.seconds === undefined ? "" : r.seconds].forEach(function (v) {
          row.appendChild(el("td", null, v));
        });
        t.appendChild(row);
      });
      box.appendChild(t);
    }
    if (b.divergence) {
      var d = b.divergence;
      box.appendChild(el("h3", null, "First diverging node"));
      if (d.node) {
        box.appendChild(el("p", null, d.op + " " + d.node + (d.aten ? " ← " + d.aten : "") +
          (d.module ? " in " + d.module : "") + ": max_abs " + d.max_abs));
        if (d.source) box.appendChild(el("pre", "err", d.source));
      } else {
        box.appendChild(el("p", "muted", d.reason || "no node diverges"));
      }
    }
    var first = body.firstChild ? body.firstChild.nextSibling : null;
    body.insertBefore(box, first ? first.nextSibling : null);
  }

  new MutationObserver(render).observe(title, { childList: true, characterData: true, subtree: true });
  render();
})();
