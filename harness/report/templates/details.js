// Extra cell details, embedded only in runs that carry them: inputs and outputs with their dims,
// dims the exporter fixed, graph changes since the previous torch version, the smallest failing
// graph and links to every bundle file. Record text only ever goes through textContent.
(function () {
  "use strict";
  var cells = JSON.parse(document.getElementById("cell-data").textContent);
  var title = document.getElementById("d-title");
  var body = document.getElementById("d-body");
  var dialog = document.getElementById("details");

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function section(parent, name) {
    var s = el("section", "d-sec");
    s.appendChild(el("h3", null, name));
    parent.appendChild(s);
    return s;
  }

  function shape(dims) {
    if (!dims) return "unknown rank";
    return "[" + dims.map(function (d) { return d === null ? "?" : String(d); }).join(", ") + "]";
  }

  function size(n) {
    if (n < 1024) return n + " B";
    return n < 1048576 ? (n / 1024).toFixed(1) + " kB" : (n / 1048576).toFixed(1) + " MB";
  }

  function table(parent, head, rows) {
    var t = el("table", "kv");
    var tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", null, h)); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      var row = el("tr");
      r.forEach(function (v) { row.appendChild(el("td", null, v)); });
      t.appendChild(row);
    });
    parent.appendChild(t);
  }

  function render() {
    if (!dialog.open || body.querySelector(".d-extra")) return;
    var c = null;
    for (var i = 0; i < cells.length; i++) {
      if (cells[i].cell_id === title.textContent) { c = cells[i]; break; }
    }
    if (!c) return;
    var box = el("div", "d-extra");
    var g = c.graph || {};
    if (g.specialised && g.specialised.length) {
      var fs = section(box, "Dims fixed by the exporter");
      g.specialised.forEach(function (f) { fs.appendChild(el("p", "hint", f.note)); });
    }
    if (g.io) {
      var rows = [];
      ["inputs", "outputs"].forEach(function (kind) {
        (g.io[kind] || []).forEach(function (t) { rows.push([kind.slice(0, -1), t.name, t.dtype, shape(t.shape)]); });
      });
      table(section(box, "Inputs and outputs of the file"), ["", "name", "dtype", "shape"], rows);
    }
    var fl = g.runtime_floor || {}, dep = g.deploy || {}, rv = g.runtime_versions || {};
    var rts = Object.keys(Object.assign({}, fl, dep, rv)).sort();
    if (rts.length) {
      var rrows = [];
      rts.forEach(function (rt) {
        var f = fl[rt] || {};
        Object.keys(f.tried || {}).forEach(function (v) { rrows.push([rt, v, "floor search", f.tried[v]]); });
        Object.keys(rv[rt] || {}).forEach(function (v) {
          var x = rv[rt][v]; rrows.push([rt, v, "listed", x.status === "pass" ? "pass" : x.stage + ": " + x.error]);
        });
        if (dep[rt]) rrows.push([rt, dep[rt].version, "deployed", dep[rt].status === "pass" ? "pass" : dep[rt].stage + ": " + dep[rt].error]);
      });
      var rsec = section(box, "Runtime releases (this file, runtime-only environments)");
      rts.forEach(function (rt) {
        var f = fl[rt];
        if (f) rsec.appendChild(el("p", "hint", rt + ": oldest ok " + (f.oldest_ok || "none listed") + (f.reason ? " · " + f.reason : "")));
      });
      table(rsec, ["runtime", "release", "why tried", "result"], rrows);
    }
    if (c.drift) {
      var ds = section(box, "Graph changes since torch " + c.drift.before);
      (c.drift.parts || []).forEach(function (p) { ds.appendChild(el("p", null, p)); });
      if (c.drift.io_changed) ds.appendChild(el("p", "hint", "input/output names or dynamic dims changed"));
    }
    var r = g.reduced;
    if (r) {
      var rs = section(box, "Smallest failing graph");
      if (r.nodes !== undefined && r.nodes !== null) {
        rs.appendChild(el("p", null, (r.original_nodes || "?") + " → " + r.nodes + " nodes" +
          (r.seconds !== undefined ? " in " + r.seconds + " s" : "")));
      }
      if (r.ops) rs.appendChild(el("p", "muted", Object.keys(r.ops).map(function (k) { return k + "×" + r.ops[k]; }).join(", ")));
      if (r.check) rs.appendChild(el("pre", "err", r.check));
      if (r.note) rs.appendChild(el("p", "hint", r.note));
    }
    if (c.bundle_files && c.bundle_files.length) {
      var bs = section(box, "Bundle files");
      var list = el("ul");
      c.bundle_files.forEach(function (f) {
        var li = el("li");
        var a = el("a", null, f.name);
        a.href = f.href.split("/").map(encodeURIComponent).join("/");   // relative: no scheme
        li.appendChild(a);
        li.appendChild(el("span", "muted", " " + size(f.bytes)));
        list.appendChild(li);
      });
      bs.appendChild(list);
    }
    if (box.childNodes.length) body.appendChild(box);
  }

  new MutationObserver(render).observe(title, { childList: true, characterData: true, subtree: true });
  render();  // a cell opened from the URL before this script ran
})();
