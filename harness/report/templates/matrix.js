// Filter, sort and cell details for matrix.html. Record text only ever goes through textContent.
(function () {
  "use strict";
  var cells = JSON.parse(document.getElementById("cell-data").textContent);
  var table = document.getElementById("matrix");
  var tbody = table.tBodies[0];
  var form = document.getElementById("filters");
  var dialog = document.getElementById("details");
  var SVG = "http://www.w3.org/2000/svg";

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      if (v !== 0 && Math.abs(v) < 1e-3) return v.toExponential(2);
      return String(Number(v.toPrecision(4)));
    }
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  // ---- filtering -------------------------------------------------------------------------------
  function searchText(row) {
    var parts = [row.textContent];
    row.querySelectorAll("td[data-idx]").forEach(function (td) {
      var c = cells[+td.dataset.idx];
      parts.push(c.cell_id, c.error, c.signature, c.stage, c.hint);
    });
    return parts.join(" ").toLowerCase();
  }

  function applyFilters() {
    var f = {};
    form.querySelectorAll("select").forEach(function (s) { f[s.dataset.axis] = s.value; });
    var q = form.elements.q.value.trim().toLowerCase();
    var torch = f.torch;
    table.querySelectorAll("[data-torch]").forEach(function (n) {
      n.hidden = !!torch && n.dataset.torch !== torch;
    });
    var shown = 0;
    Array.prototype.forEach.call(tbody.rows, function (row) {
      var ok = ["case", "exporter", "opset", "runtime"].every(function (a) {
        return !f[a] || row.dataset[a] === f[a];
      });
      var visible = row.querySelectorAll("td[data-idx]:not([hidden])");
      if (ok && f.status) {
        ok = Array.prototype.some.call(visible, function (td) { return td.dataset.status === f.status; });
      }
      if (ok && torch) ok = visible.length > 0;
      if (ok && q) ok = searchText(row).indexOf(q) >= 0;
      // Rows skipped on every torch are folded into the overview's skip lines unless asked for.
      if (ok && row.dataset.skiponly && f.status !== "skip" && !(form.elements.skips && form.elements.skips.checked)) ok = false;
      row.hidden = !ok;
      row.querySelectorAll("td[data-status]").forEach(function (td) {
        td.classList.toggle("dim", !!f.status && td.dataset.status !== f.status);
      });
      if (ok) shown++;
    });
    document.getElementById("shown").textContent = shown + " of " + tbody.rows.length + " rows";
  }

  form.addEventListener("input", applyFilters);
  form.addEventListener("change", applyFilters);
  form.addEventListener("reset", function () { setTimeout(applyFilters, 0); });
  form.addEventListener("submit", function (e) { e.preventDefault(); });

  // ---- overview: a grid cell opens its case's rows in the matrix -------------------------------
  document.querySelectorAll("td[data-ov-case]").forEach(function (td) {
    td.addEventListener("click", function () {
      [["case", td.dataset.ovCase], ["runtime", td.dataset.ovRuntime], ["torch", td.dataset.ovTorch || ""]].forEach(function (p) {
        var sel = form.querySelector("select[data-axis=" + p[0] + "]");
        if (sel) sel.value = p[1];
      });
      applyFilters();
      document.getElementById("matrix-section").scrollIntoView();
    });
  });

  // ---- sorting ---------------------------------------------------------------------------------
  function sortKey(row, key, numeric) {
    var raw;
    if (key.charAt(0) === "t" && /^t\d+$/.test(key)) {
      var td = row.querySelector("td[data-" + key + "]");
      raw = td ? td.getAttribute("data-" + key) : "99";
    } else {
      raw = row.dataset[key];
    }
    return numeric ? parseFloat(raw) : raw;
  }

  table.tHead.querySelectorAll("th[data-sort]").forEach(function (th) {
    th.addEventListener("click", function () {
      var key = th.dataset.sort, numeric = !!th.dataset.numeric;
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      table.tHead.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      var rows = Array.prototype.slice.call(tbody.rows);
      rows.sort(function (a, b) {
        var x = sortKey(a, key, numeric), y = sortKey(b, key, numeric);
        var c = numeric ? x - y : String(x).localeCompare(String(y));
        return c * dir;
      });
      rows.forEach(function (r) { tbody.appendChild(r); });
    });
  });

  // ---- details ---------------------------------------------------------------------------------
  function section(body, title) {
    var s = el("section", "d-sec");
    s.appendChild(el("h3", null, title));
    body.appendChild(s);
    return s;
  }

  function kv(parent, pairs) {
    var t = el("table", "kv");
    pairs.forEach(function (p) {
      if (p[1] === undefined || p[1] === null || p[1] === "") return;
      var tr = el("tr");
      tr.appendChild(el("th", null, p[0]));
      tr.appendChild(el("td", null, fmt(p[1])));
      t.appendChild(tr);
    });
    parent.appendChild(t);
  }

  function histogram(parent, h) {
    var w = 360, ht = 80, n = h.counts.length, max = Math.max.apply(null, h.counts) || 1;
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + (ht + 16));
    svg.setAttribute("class", "hist");
    h.counts.forEach(function (c, i) {
      var r = document.createElementNS(SVG, "rect");
      var bh = Math.max(c ? 1 : 0, (c / max) * ht);
      r.setAttribute("x", (i * w) / n + 1);
      r.setAttribute("y", ht - bh);
      r.setAttribute("width", w / n - 2);
      r.setAttribute("height", bh);
      svg.appendChild(r);
    });
    [[0, "start", h.lo], [w, "end", h.hi]].forEach(function (a) {
      var t = document.createElementNS(SVG, "text");
      t.setAttribute("x", a[0]); t.setAttribute("y", ht + 13); t.setAttribute("text-anchor", a[1]);
      t.textContent = fmt(a[2]) + " ms";
      svg.appendChild(t);
    });
    parent.appendChild(svg);
    parent.appendChild(el("p", "muted", h.n + " samples" +
      (h.beyond ? "; " + h.beyond + " slower ones are counted in the last bar" : "")));
  }

  function opBars(parent, ops) {
    var names = Object.keys(ops).sort(function (a, b) { return ops[b] - ops[a] || a.localeCompare(b); });
    var max = names.length ? ops[names[0]] : 1;
    var list = el("div", "bars");
    names.forEach(function (name) {
      var row = el("div", "bar");
      row.appendChild(el("span", "bar-label", name));
      var fill = el("span", "bar-fill");
      fill.style.width = Math.max(2, (100 * ops[name]) / max) + "%";
      row.appendChild(fill);
      row.appendChild(el("span", "bar-n", ops[name]));
      list.appendChild(row);
    });
    parent.appendChild(list);
  }

  function openCell(idx) {
    var c = cells[idx];
    if (!c) return;
    document.getElementById("d-title").textContent = c.cell_id || [c.case, c.exporter, c.opset, c.runtime].join(" · ");
    var body = document.getElementById("d-body");
    body.textContent = "";
    var head = el("p");
    head.appendChild(el("span", "chip s-" + c.status, c.status + (c.stage ? " · " + c.stage : "")));
    body.appendChild(head);
    kv(body, [["case", c.case], ["torch", c.torch], ["exporter", c.exporter],
              ["opset", c.opset + (c.opset_actual && c.opset_actual !== c.opset ? " (file declares " + c.opset_actual + ")" : "")],
              ["runtime", c.runtime], ["options", c.options && Object.keys(c.options).length ? c.options : null],
              ["signature", c.signature], ["bundle", c.bundle]]);
    if (c.error || c.hint || c.reason || (c.notes && c.notes.length)) {
      var e = section(body, "Error");
      if (c.error) e.appendChild(el("pre", "err", c.error));
      if (c.hint) e.appendChild(el("p", "hint", "hint: " + c.hint));
      if (c.reason) e.appendChild(el("p", "hint", "known failure: " + c.reason));
      (c.notes || []).forEach(function (n) { e.appendChild(el("p", "muted", n)); });
    }
    if (c.log) section(body, "Log (from the first traceback)").appendChild(el("pre", "log", c.log));
    var p = c.parity || {};
    if (Object.keys(p).length) {
      var ps = section(body, "Parity with torch eager");
      kv(ps, [["max_abs", p.max_abs], ["max_rel", p.max_rel], ["atol", p.atol], ["rtol", p.rtol]]);
      (p.shapes || []).forEach(function (s) {
        ps.appendChild(el("p", "muted", "inputs " + JSON.stringify(s.inputs) + ": max_abs " + fmt(s.max_abs) + ", max_rel " + fmt(s.max_rel)));
      });
    }
    var l = c.latency || {};
    if (Object.keys(l).length) {
      var ls = section(body, "Latency (ms)");
      var load = l.load || {};
      kv(ls, [["median", l.median], ["p90", l.p90], ["min", l.min], ["iqr", l.iqr], ["cv", l.cv],
              ["spread", l.spread], ["iterations", l.iterations], ["threads", l.threads],
              ["unstable", l.unstable ? "yes: " + (l.unstable_why || "robust spread or median interval too wide") : null],
              ["processes", l.processes && l.processes.length ? l.processes.map(fmt).join(", ") + " (medians of the fresh processes that timed it)" : null],
              ["timed with", l.same_file_as ? l.same_file_as + " (the same file, inputs and runtime settings: one timing for both)" : null],
              ["bimodal", l.bimodal ? "two modes across fresh processes: " + (l.modes || []).map(fmt).join(" / ") + " ms" : null],
              ["loaded", l.loaded ? "yes: others used " + fmt(load.other_cpu) + " of the CPUs, steal " + fmt(load.steal) + " (figure not trusted; the gate never calls it slower)" : null]]);
      if (c.histogram) histogram(ls, c.histogram);
    }
    var g = c.graph || {};
    if (Object.keys(g).length) {
      var gs = section(body, "Graph");
      kv(gs, [["nodes", g.nodes], ["bytes", g.bytes], ["ir_version", g.ir_version], ["opset_imports", g.opset_imports],
              ["producer", g.producer], ["inputs", g.inputs], ["outputs", g.outputs]]);
      if (g.ops) opBars(gs, g.ops);
      var rf = g.runtime_facts || {};
      if (Object.keys(rf).length) {
        // what the runtime reports it ran: providers, nodes per provider, precision, versions
        var first = ["providers", "placement", "placement_time_share"];
        kv(section(body, "Runtime"), first.map(function (k) { return [k, rf[k]]; }).concat(
          Object.entries(rf).filter(function (e) { return first.indexOf(e[0]) < 0 && e[0] !== "notes"; })));
      }
    }
    if (c.versions && Object.keys(c.versions).length) kv(section(body, "Versions"), Object.entries(c.versions));
    if (c.duration_s && Object.keys(c.duration_s).length) kv(section(body, "Stage wall time (s)"), Object.entries(c.duration_s));
    if (c.repro) {
      var rs = section(body, "Reproduce");
      rs.appendChild(el("pre", "repro", c.repro));
    }
    if (!dialog.open) dialog.showModal();
    history.replaceState(null, "", "#cell=" + encodeURIComponent(c.cell_id || idx));
  }

  function cellFromEvent(e) {
    var t = e.target.closest("td[data-idx], a.open-cell");
    return t ? +t.dataset.idx : null;
  }
  document.addEventListener("click", function (e) {
    var idx = cellFromEvent(e);
    if (idx === null) return;
    e.preventDefault();
    openCell(idx);
  });
  tbody.addEventListener("keydown", function (e) {
    if (e.key !== "Enter" && e.key !== " ") return;
    var idx = cellFromEvent(e);
    if (idx !== null) { e.preventDefault(); openCell(idx); }
  });
  dialog.addEventListener("close", function () { history.replaceState(null, "", location.pathname); });
  dialog.addEventListener("click", function (e) { if (e.target === dialog) dialog.close(); });

  applyFilters();
  var m = /^#cell=(.+)$/.exec(location.hash);
  if (m) {
    var id = decodeURIComponent(m[1]);
    cells.forEach(function (c, i) { if (c.cell_id === id) openCell(i); });
  }
})();
