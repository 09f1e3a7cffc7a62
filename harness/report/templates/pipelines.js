// Pipelines, embedded only in runs with post-export pipelines: the pipeline filter over the matrix
// rows and the pipelines section's step rows (after the matrix's own filters, registered first).
(function () {
  "use strict";
  var form = document.getElementById("filters");
  var select = form.querySelector("select[data-pipeline-filter]");
  if (!select) return;

  function filter() {
    var pipeline = select.value;
    document.querySelectorAll("#matrix tbody tr[data-pipeline]").forEach(function (row) {
      if (pipeline && row.dataset.pipeline !== pipeline) row.hidden = true;
    });
    document.querySelectorAll("#pipeline-steps tbody tr[data-pipeline]").forEach(function (row) {
      row.hidden = !!pipeline && row.dataset.pipeline !== pipeline;
    });
  }
  form.addEventListener("input", filter);
  form.addEventListener("change", filter);
  form.addEventListener("reset", function () { setTimeout(filter, 0); });
})();
