// The history page: cells with their trend strips (filters, search), a cell's history on click,
// and the staleness banner decided at view time (the page may be read long after it was built).
// Every text from the data is assigned with textContent.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("history-data").textContent);
  const STATUS = { p: "pass", f: "fail", c: "crash", t: "timeout", x: "xfail", X: "xpass", s: "skip", e: "error", "-": null };
  const FAILING = new Set(["fail", "crash", "timeout"]);
  const body = document.querySelector("#cells tbody");
  const form = document.getElementById("hfilters");
  if (data.newest_started) {
    const age = (Date.now() / 1000 - data.newest_started) / 3600;
    if (age > data.max_age_h) {
      const banner = document.getElementById("stale-banner");
      banner.hidden = false;
      document.getElementById("stale-text").textContent =
        "the newest night ran " + age.toFixed(1) + " h ago, more than " + data.max_age_h + " h: a nightly is missing.";
    }
  }
  if (!body || !form) return;
  function td(text, cls) { const e = document.createElement("td"); e.textContent = text == null ? "" : String(text); if (cls) e.className = cls; return e; }
  function chip(status, stage) { const s = document.createElement("span"); s.className = "chip s-" + status; s.textContent = status + (stage ? " · " + stage : ""); return s; }
  function strip(codes) {
    const s = document.createElement("span"); s.className = "strip";
    for (let i = 0; i < codes.length; i++) {
      const st = STATUS[codes[i]], b = document.createElement("i");
      b.className = st ? "s-" + st : "absent";
      b.title = data.nights[i].night + ": " + (st || "not run");
      s.appendChild(b);
    }
    return s;
  }
  const rows = data.cells.map(function (c) {
    const tr = document.createElement("tr");
    tr.dataset.cell = c.id;
    const opset = c.opset + (c.options ? " (" + c.options + ")" : "");
    [c.torch, c.case, c.exporter, opset, c.runtime].forEach(function (v) { tr.appendChild(td(v)); });
    const now = td(""); now.appendChild(chip(c.status, c.streaks[c.streaks.length - 1].stage)); tr.appendChild(now);
    tr.appendChild(td(c.since)); tr.appendChild(td(c.days, "num"));
    tr.appendChild(td(c.first_failed || "–")); tr.appendChild(td(c.fixed || "–"));
    const t = td(""); t.appendChild(strip(c.strip)); tr.appendChild(t);
    tr.addEventListener("click", function () { open(c); });
    return { tr: tr, c: c, text: [c.id, c.case, c.runtime, c.exporter, c.torch, c.reason || ""].join(" ").toLowerCase(),
             skipOnly: /^[s-]*$/.test(c.strip), changed: c.streaks.length > 1 };
  });
  rows.forEach(function (r) { body.appendChild(r.tr); });
  form.querySelectorAll("select[data-axis]").forEach(function (sel) {
    const values = Array.from(new Set(data.cells.map(function (c) { return String(c[sel.dataset.axis]); }))).sort();
    values.forEach(function (v) { const o = document.createElement("option"); o.value = v; o.textContent = v; sel.appendChild(o); });
  });
  function apply() {
    const f = new FormData(form), q = String(f.get("q") || "").toLowerCase(), state = f.get("state");
    let shown = 0;
    rows.forEach(function (r) {
      let ok = true;
      form.querySelectorAll("select[data-axis]").forEach(function (sel) {
        if (sel.value && String(r.c[sel.dataset.axis]) !== sel.value) ok = false;
      });
      if (state === "failing") ok = ok && FAILING.has(r.c.status);
      else if (state === "changed") ok = ok && r.changed;
      else if (state === "skip") ok = ok && r.skipOnly;
      else ok = ok && !r.skipOnly;   // skipped-only cells are folded into the lines above the table
      if (q && r.text.indexOf(q) < 0) ok = false;
      r.tr.hidden = !ok;
      shown += ok ? 1 : 0;
    });
    document.getElementById("hshown").textContent = shown + " of " + rows.length + " cells";
  }
  function open(c) {
    rows.forEach(function (r) { r.tr.classList.toggle("open", r.c === c); });
    const sec = document.getElementById("cell"), tbody = document.querySelector("#cell-history tbody");
    document.getElementById("cell-name").textContent = c.id;
    tbody.textContent = "";
    c.streaks.slice().reverse().forEach(function (s) {
      const tr = document.createElement("tr");
      const link = function (night) {
        const e = td(""), a = document.createElement("a");
        a.href = "nights/" + night + ".html"; a.textContent = night; e.appendChild(a); return e;
      };
      tr.appendChild(link(s.first)); tr.appendChild(link(s.last)); tr.appendChild(td(s.nights, "num"));
      const st = td(""); st.appendChild(chip(s.status, s.stage)); tr.appendChild(st);
      tr.appendChild(td(s.changed.length ? s.changed.join("; ") : "–", "versions"));
      tr.appendChild(td(s.error || "", "err"));
      tbody.appendChild(tr);
    });
    sec.hidden = false;
    sec.scrollIntoView();
  }
  document.querySelectorAll("a.open-history").forEach(function (a) {
    a.addEventListener("click", function (ev) {
      ev.preventDefault();
      const c = data.cells.find(function (x) { return x.id === a.dataset.cell; });
      if (c) open(c);
    });
  });
  form.addEventListener("input", apply);
  form.addEventListener("change", apply);
  form.addEventListener("reset", function () { setTimeout(apply, 0); });
  apply();
})();
