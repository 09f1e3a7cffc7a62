"""The part of a failing cell's ISSUE.md that depends on the blamed layer, and that layer's own
minimal reproduction in the bundle (worker side):

- model code under a documented limitation: a note to the model's owner (not an upstream report),
  with the model's line and the documentation;
- the exporter's optimizer: ``unoptimized.onnx`` (the same export with ``optimize=False``) and
  ``repro_optimizer.py``, which runs onnxscript's optimizer on it and checks the result;
- the version converter: ``native.onnx`` (the export at the native opset) and
  ``repro_converter.py``, which converts it with ``onnx.version_converter`` and checks the result;
- a runtime: ``repro_runtime.py``, which loads ``model.onnx`` in the runtime alone, no torch;
- capture and translation: the bundle's ``repro.py`` (the export call itself) is the repro.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from harness.core.record import Record
from harness.core.text import md_code, md_text
from harness.worker.diagnose.layer_experiments import kept

_CHECK_AND_RUN = '''
def check_and_run(path):
    onnx.checker.check_model(path, full_check=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    with np.load("inputs.npz") as data:
        names = [i.name for i in sess.get_inputs()]
        feeds = ({{k: data[k] for k in names}} if set(names) <= set(data.files)
                 else dict(zip(names, (data[k] for k in data.files))))
    got = sess.run(None, feeds)
    with np.load("expected.npz") as data:
        for k, out in zip(data.files, got):
            np.testing.assert_allclose(out, data[k], atol=ATOL, rtol=RTOL)
    print("ok:", path)
'''

OPTIMIZER_SCRIPT = '''"""onnxscript's optimizer breaks a file that is right before it (no torch needed)."""
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnxscript import optimizer

ATOL, RTOL = {atol!r}, {rtol!r}
''' + _CHECK_AND_RUN + '''
check_and_run("unoptimized.onnx")            # passes
model = ir.load("unoptimized.onnx")
optimizer.optimize(model)                     # what torch.onnx.export(optimize=True) runs
ir.save(model, "optimized.onnx")
check_and_run("optimized.onnx")               # fails
'''

CONVERTER_SCRIPT = '''"""The version converter breaks a file that is right at the exporter's native opset (no torch)."""
import numpy as np
import onnx
import onnxruntime as ort

ATOL, RTOL = {atol!r}, {rtol!r}
''' + _CHECK_AND_RUN + '''
check_and_run("native.onnx")                  # opset {native}: passes
{convert}
check_and_run("converted.onnx")               # opset {opset}: fails
'''

RUNTIME_SCRIPT = '''"""{runtime} on the exported file alone (no torch): the file is right (the ONNX reference evaluator
or ONNX Runtime agrees with torch eager on it) and {runtime} fails on it."""
import numpy as np

ATOL, RTOL = {atol!r}, {rtol!r}
with np.load("inputs.npz") as data:
    feeds = {{k: data[k] for k in data.files}}
with np.load("expected.npz") as data:
    expected = [data[k] for k in data.files]
{run}
for out, ref in zip(got, expected):
    np.testing.assert_allclose(np.asarray(out), ref, atol=ATOL, rtol=RTOL)
print("ok")
'''
_CONVERT = {
    "version converter: onnx": 'onnx.save(onnx.version_converter.convert_version(onnx.load("native.onnx"), {opset}), '
                               '"converted.onnx")',
    # torch.onnx calls onnxscript's conversion inside the export (onnxscript._framework_apis.
    # torch_2_x.convert_version): model.onnx is what it returned for the requested opset (with
    # torch 2.6's onnxscript, below 18: the opset-18 model, unconverted and un-inlined)
    "version converter: onnxscript": 'model = onnx.load("model.onnx")\n'
                                     'print("requested opset {opset}; the file onnxscript\'s conversion returned is opset",\n'
                                     '      [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")])\n'
                                     'onnx.save(model, "converted.onnx")',
}
_RUN = {
    "ort": '''import onnxruntime as ort
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], feeds.values())))''',
    "openvino": '''import openvino as ov
compiled = ov.Core().compile_model("model.onnx", "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
got = list(compiled(list(feeds.values())).values())''',
}


def layer_repro(ctx: Any, rec: Record, bundle_dir: Path) -> list[str]:
    """Write the layer's repro into the bundle; the ISSUE.md lines that present the layer."""
    blame = rec.blame
    if blame is None or not blame.layer:
        return []
    lines = ["## Layer", "", f"**{md_text(blame.layer)}** ({md_text(blame.kind or 'bug')}); "
             + (f"report to {md_code(blame.repository)}." if blame.repository else "no upstream report."), ""]
    if blame.kind == "documented limitation":
        lines += ["This is a documented limitation, not a bug: "
                  + ("a note to the model's owner." if blame.layer == "model code" else "no upstream report is due."), ""]
    lines += [f"Documentation: {md_text(d)}" for d in blame.docs] + ([""] if blame.docs else [])
    if blame.experiments:
        lines += ["| experiment | outcome | detail |", "| --- | --- | --- |"]
        lines += [f"| {md_text(e.get('experiment'))} | {md_text(e.get('outcome'))} | {md_text(e.get('detail', ''), 200)} |"
                  for e in blame.experiments]
        lines.append("")
    lines += [f"Remedy: {md_text('works with ' + '; or '.join(blame.remedies) if blame.remedies else 'nothing tried works')}", ""]
    tol = (ctx.spec.atol, ctx.spec.rtol) if getattr(ctx, "spec", None) is not None else (1e-4, 1e-3)
    script = None
    if blame.layer.startswith("optimizer") and kept(ctx, "unoptimized").exists():
        shutil.copy2(kept(ctx, "unoptimized"), bundle_dir / "unoptimized.onnx")
        script = ("repro_optimizer.py", OPTIMIZER_SCRIPT.format(atol=tol[0], rtol=tol[1]))
    elif blame.layer.startswith("version converter") and kept(ctx, "native").exists():
        shutil.copy2(kept(ctx, "native"), bundle_dir / "native.onnx")
        convert = _CONVERT.get(blame.layer, _CONVERT["version converter: onnx"]).format(opset=rec.opset)
        script = ("repro_converter.py", CONVERTER_SCRIPT.format(atol=tol[0], rtol=tol[1], opset=rec.opset,
                                                                native=18, convert=convert))
    elif blame.layer.startswith("runtime") and (run := _RUN.get(rec.runtime.split("-")[0].split("@")[0])):
        script = ("repro_runtime.py", RUNTIME_SCRIPT.format(atol=tol[0], rtol=tol[1], runtime=rec.runtime, run=run))
    if script is not None:
        (bundle_dir / script[0]).write_text(script[1], encoding="utf-8")
        lines += [f"Minimal reproduction of this layer: `python {script[0]}` (in this folder; no torch).", ""]
    return lines
