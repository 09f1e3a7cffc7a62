"""A failing cell's report for upstream, written into its bundle (``write_upstream``):

- ``repro.py``: a self-contained script, torch and the runtime only (no import of this project):
  imports the case's source by path, builds the model, loads the inputs from ``inputs.npz``, calls
  ``torch.onnx.export`` with the cell's very arguments (``export.export_arguments``), checks the
  file, runs the runtime at every shape the cell ran and compares with eager; it fails (exit 1,
  the traceback of what failed) where the cell failed, after a line ``repro stage: STAGE``.
- ``ISSUE.md``: title, versions, error, blame and evidence, first diverging node, steps, expected.
- ``test_data_set_0/`` (and ``_1`` for the second shape): ``input_N.pb`` / ``output_N.pb``, ONNX's
  test-data layout (onnx.numpy_helper), for onnx_test_runner, Polygraphy and any ONNX tool.

Worker side: standard library at module level; numpy, onnx and torch lazily.
"""
from __future__ import annotations

import importlib.util
import json
import math
import platform
import shutil
from pathlib import Path
from typing import Any

from harness.core.cell import CaseRef
from harness.core.record import Record
from harness.core.text import ENCODE_ERRORS, md_code, md_fenced, md_text, safe_text
from harness.worker.export_source import ArgumentSource, NotScriptable, tensor_names

REPRO = "repro.py"
ISSUE = "ISSUE.md"


def case_source(group: Any, base_dir: Path) -> tuple[str, str]:
    """(absolute path of the case's source file, function name)."""
    from harness.probes import PROBES

    ref = CaseRef.parse(PROBES.get(group.case_ref, group.case_ref))
    if ref.is_file:
        path = Path(ref.target)
        return str((path if path.is_absolute() else base_dir / path).resolve()), ref.function
    spec = importlib.util.find_spec(ref.target)
    if spec is None or not spec.origin:
        raise NotScriptable(f"module {ref.target} has no source file")
    return str(Path(spec.origin).resolve()), ref.function


# ---- the script --------------------------------------------------------------------------------

def _literal(value: Any) -> str:
    """Python source of a value from the run (a path, a name, an error): built by ``repr`` only,
    so no byte of it (a newline, a NUL, ``C:\\Users``) is ever code; floats as ``float('nan')``
    where ``repr`` is no literal."""
    if isinstance(value, float) or (not isinstance(value, bool) and hasattr(value, "__float__")
                                     and not isinstance(value, (int, str))):
        value = float(value)
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    return repr(safe_text(str(value)))


_HEAD = '''"""Reproduces a cell of the torch -> ONNX matrix where it failed (CELL, STAGE, ERROR below).

Self-contained: torch, numpy, onnx and the runtime (RUNTIME below); run it from this folder with
`python repro.py`. Exit status 1 and the traceback of what failed where it reproduces; 0 where
it does not.
"""
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

# What failed, as recorded (text from the run: string literals only).
CELL = {cell}
STAGE = {stage}
RUNTIME = {runtime}
ERROR = {error}

HERE = Path(__file__).resolve().parent
# The case's source, copied beside this script from ORIGINAL_CASE_FILE.
ORIGINAL_CASE_FILE = {case_file}
CASE_FILE = HERE / "case_source.py"
CASE_FUNCTION = {case_fn}
ATOL, RTOL = {atol}, {rtol}


def stage(name):
    print("repro stage:", name, flush=True)


def flatten(out):
    """Eager outputs as numpy arrays, in the order the exporters flatten them."""
    if isinstance(out, torch.Tensor):
        return [out.detach().numpy()]
    if isinstance(out, dict):
        return [a for v in out.values() if v is not None for a in flatten(v)]
    if isinstance(out, (list, tuple)):
        return [a for v in out for a in flatten(v)]
    if hasattr(out, "to_tuple"):
        return flatten(out.to_tuple())
    return []


def load_case():
    spec = importlib.util.spec_from_file_location("case_module", str(CASE_FILE))
    module = importlib.util.module_from_spec(spec)
    sys.modules["case_module"] = module
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return getattr(module, CASE_FUNCTION)()[0].eval()


def compare(expected, actual, label):
    assert len(expected) == len(actual), f"{{label}}: {{len(actual)}} outputs, eager {{len(expected)}}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        a = np.asarray(a)
        assert a.shape == e.shape, f"{{label}}: output {{i}} shape {{list(a.shape)}} != eager {{list(e.shape)}}"
        np.testing.assert_allclose(a, e, atol=ATOL, rtol=RTOL, err_msg=f"{{label}}: output {{i}}")


def main():
    model = load_case()
{dims}    x = np.load(HERE / "inputs.npz")
    path = str(Path(tempfile.mkdtemp()) / "model.onnx")
    stage("export")
    torch.onnx.export(model, {args}, path, {kwargs})
    stage("check")
    onnx.checker.check_model(path, full_check=True)
{loads}    shapes = {shapes}
    with torch.no_grad():
        expected = [flatten(model(*a, **k)) for a, k in (eager() for eager in shapes)]
    feeds = [dict(np.load(HERE / f)) for f in {npz_files!r}]
{runtime_code}
    print("did not reproduce: every stage passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

_ORT = '''    import onnxruntime as ort

    stage("load")
    options = ort.SessionOptions()
{threads}    session = ort.InferenceSession(path, options, providers={providers!r})
    names = [i.name for i in session.get_inputs()]
    for i, f in enumerate(feeds):
        label = "example shape" if i == 0 else "second shape"
        stage("run")
        use = {{n: f[n] for n in names}} if all(n in f for n in names) else dict(zip(names, f.values()))
        actual = session.run(None, use)
        stage("parity")
        compare(expected[i], actual, label)
'''

_OPENVINO = '''    import openvino as ov

    stage("load")
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {config!r})
    request = compiled.create_infer_request()
    names = [p.get_any_name() for p in compiled.inputs]
    for i, f in enumerate(feeds):
        label = "example shape" if i == 0 else "second shape"
        stage("run")
        use = {{n: np.require(f[n], requirements="C") for n in names}} if all(n in f for n in names) \\
            else dict(zip(names, f.values()))
        request.infer(use)
        actual = [request.get_output_tensor(k).data.copy() for k in range(len(compiled.outputs))]
        stage("parity")
        compare(expected[i], actual, label)
'''


def _runtime_code(rec: Record, cell: Any, threads: int | None) -> str:
    precision = str(rec.options.get("precision") or "fp32")
    if rec.runtime.startswith("ort"):
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if rec.runtime == "ort-cuda" \
            else ["CPUExecutionProvider"]
        lines = f"    options.intra_op_num_threads = {int(threads)}\n" if threads else ""
        return _ORT.format(threads=lines, providers=providers)
    if rec.runtime == "openvino":
        from harness.runtimes.openvino import compile_config

        return _OPENVINO.format(config=compile_config(precision, threads))
    raise NotScriptable(f"runtime {rec.runtime} is not written out as a script")


def repro_script(ctx: Any, cell: Any, rec: Record, copy_to: Path | None = None) -> str:
    """The source of ``repro.py`` for a failing cell (``NotScriptable`` where it cannot be)."""
    from harness.worker.export import export_arguments

    spec, g = ctx.spec, ctx.group
    if spec is None:
        raise NotScriptable("the case was not built")
    if not getattr(ctx, "feeds", None):
        # A failure at reference: torch eager itself raised before any input was saved (a
        # repro.py would load an inputs.npz that was never written).
        raise NotScriptable("the cell failed at reference, before any input was saved or anything exported: "
                            "the case function and its model in torch eager reproduce it")
    if g.exporter not in ("torchscript", "dynamo"):
        raise NotScriptable(f"exporter {g.exporter} is not torch.onnx.export")
    case_file, case_fn = case_source(g, Path(ctx.job.base_dir))
    text = Path(case_file).read_text(errors="replace")
    if "import harness" in text or "from harness" in text:
        raise NotScriptable(f"the case's source {case_file} imports this project")
    if copy_to is not None:
        shutil.copy2(case_file, copy_to / "case_source.py")
    from harness.worker.outputs import output_names

    opts = g.options
    outputs = output_names(ctx.output_paths)   # as GroupContext.prepare names them
    named = getattr(spec.model, "onnx_output_names", None)
    if named and len(named) == len(outputs):
        outputs = list(named)
    args, kwargs, _ = export_arguments(spec, g.exporter, g.opset, dynamic=opts.dynamic,
                                       constant_folding=opts.constant_folding, outputs=outputs,
                                       dim_policy=opts.dim_policy, switches=opts.switches())
    src = ArgumentSource(tensor_names(spec.example), "x")
    args_src = src(tuple(args))
    kwargs_src = ", ".join(f"{k}={src(v)}" for k, v in kwargs.items())
    shapes, npz, loads = [], [], ""
    for i, inputs in enumerate(ctx.shapes):
        var = "x" if i == 0 else f"x{i + 1}"
        file = "inputs.npz" if i == 0 else f"inputs_shape{i + 1}.npz"
        if i:
            loads += f"    {var} = np.load(HERE / {file!r})\n"
        s = ArgumentSource(tensor_names(inputs), var)
        shapes.append(f"lambda: ({s(tuple(inputs.args))}, {s(dict(inputs.kwargs))})")
        npz.append(file)
    dims = ""
    if "Dim" in kwargs_src or src.dims:
        dims = "    from torch.export import Dim\n\n"
    if src.dims:
        dims += "    DIMS = {" + ", ".join(f"{k!r}: {v}" for k, v in sorted(src.dims.items())) + "}\n"
    stage_runtime = _runtime_code(rec, cell, ctx.job.threads)
    source = _HEAD.format(cell=_literal(rec.cell_id), stage=_literal(rec.stage), error=_literal(rec.error or ""),
                          runtime=_literal(rec.runtime), case_file=_literal(case_file), case_fn=_literal(case_fn),
                          atol=_literal(spec.atol), rtol=_literal(spec.rtol), dims=dims, args=args_src,
                          kwargs=kwargs_src, shapes="[" + ", ".join(shapes) + "]", loads=loads, npz_files=npz,
                          runtime_code=stage_runtime)
    compile(source, REPRO, "exec")   # NotScriptable-free by construction; a SyntaxError is a bug here
    return source


# ---- ONNX test data, ISSUE.md ------------------------------------------------------------------

def write_test_data(ctx: Any, bundle_dir: Path) -> list[str]:
    """``test_data_set_K/input_N.pb``, ``output_N.pb`` per shape the cell ran (names: the graph's)."""
    from onnx import numpy_helper

    folders = []
    outputs = list((getattr(ctx, "graph", None) or {}).get("outputs") or [])
    for k, (feeds, refs) in enumerate(zip(ctx.feeds, ctx.references)):
        folder = bundle_dir / f"test_data_set_{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for i, (name, value) in enumerate(feeds.items()):
            (folder / f"input_{i}.pb").write_bytes(numpy_helper.from_array(value, name).SerializeToString())
        for i, value in enumerate(refs):
            name = outputs[i] if i < len(outputs) else f"output_{i}"
            (folder / f"output_{i}.pb").write_bytes(numpy_helper.from_array(value, name).SerializeToString())
        folders.append(folder.name)
    return folders


def _versions_table(rec: Record) -> str:
    rows = [("torch", rec.versions.get("torch_build") or rec.torch)]
    for key in ("onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "numpy",
                "transformers"):
        if rec.versions.get(key):
            rows.append((key, rec.versions[key]))
    rows += [("runtime", f"{rec.runtime} {rec.versions.get('runtime') or ''}".strip()),
             ("python", rec.versions.get("python") or platform.python_version()),
             ("OS", platform.platform()), ("CPU", platform.processor() or platform.machine())]
    return "| package | version |\n| --- | --- |\n" + "\n".join(f"| {md_text(k)} | {md_text(v)} |" for k, v in rows)


_WHAT = {"export": "torch.onnx.export fails", "check": "the exported file fails the ONNX checker",
         "load": "{runtime} cannot load the exported file", "run": "{runtime} fails to run the exported file",
         "parity": "{runtime} returns values that differ from torch eager"}


def issue_text(rec: Record, repro_note: str | None, data_sets: list[str],
               tolerance: tuple[Any, Any] = (None, None), layer_lines: list[str] | None = None) -> str:
    """ISSUE.md: every text from the run (names, errors, blame, paths) either escaped on one line
    (``md_text``: no raw HTML or control character) or verbatim inside a code block whose fence
    no backtick run in it can close (``md_fenced``)."""
    blame = rec.blame
    party = md_text(blame.party if blame else "unknown")
    where = f" · report to {md_text(blame.repository)}" if blame and blame.repository else ""
    if blame and blame.kind == "documented limitation":
        where += " · a documented limitation, not a bug"
    what = _WHAT.get(rec.stage or "", "fails").format(runtime=rec.runtime)
    title = f"[{rec.exporter} exporter, opset {rec.opset}] {rec.case}: {what} (torch {rec.torch})"
    lines = [f"# {md_text(title)}", "", f"Blamed party: **{party}**{where}.", "", "## Versions", "",
             _versions_table(rec), "", "## Error", "", *md_fenced(rec.error or ""), ""]
    if blame:
        lines += ["## Whose bug it is", "", md_text(blame.reason), ""]
        if blame.source:
            lines += ["Source line:", "", *md_fenced(blame.source), ""]
        if blame.evidence:
            lines += ["| check | outcome | detail |", "| --- | --- | --- |"]
            lines += [f"| {md_text(r.get('rung'))} | {md_text(r.get('outcome'))} | {md_text(r.get('detail', ''), 200)} |"
                      for r in blame.evidence]
            lines.append("")
        if blame.divergence:
            d = blame.divergence
            lines += ["## First diverging node", ""]
            if d.get("node"):
                lines.append(f"ONNX node {md_code(d['node'])} ({md_text(d.get('op'))}), from {md_code(d.get('aten'))} "
                             f"in {md_code(d.get('module'))}: max_abs {md_text(d.get('max_abs'))} (first of "
                             f"{md_text(d.get('compared'))} values compared in graph order)")
                if d.get("source"):
                    lines += ["", *md_fenced(d["source"])]
            else:
                lines.append(md_text(d.get("reason", "")))
            lines.append("")
    lines += layer_lines or []
    lines += ["## Steps", ""]
    if repro_note is None:
        lines += ["```", "python repro.py", "```", "",
                  "`repro.py` builds the model from the case's source (`case_source.py`), loads `inputs.npz`, exports with "
                  "the same `torch.onnx.export` arguments, runs the runtime and compares with eager.", ""]
    else:
        lines += [f"No `repro.py` for this cell: {md_text(repro_note)}. `model.onnx` and `inputs.npz` are attached.", ""]
    if data_sets:
        lines += [f"Inputs and eager outputs in ONNX's test-data layout: {', '.join(md_code(d + '/') for d in data_sets)} "
                  "(`input_N.pb`, `output_N.pb`).", ""]
    if rec.graph.get("reduced"):
        lines += ["The smallest failing graph: `reduced.onnx` with `reduced_inputs.npz`.", ""]
    lines += ["## Expected", "",
              {"export": "The model exports (it runs in torch eager at these inputs).",
               "check": "The exported file passes `onnx.checker.check_model(full_check=True)`.",
               }.get(rec.stage or "", f"The runtime loads and runs the file and matches torch eager within "
                                      f"atol={md_text(tolerance[0])} rtol={md_text(tolerance[1])} at every shape."), ""]
    return "\n".join(lines)


def write_upstream(ctx: Any, rec: Record, bundle_dir: Path) -> None:
    """repro.py, ISSUE.md and the ONNX test data into a failing cell's bundle (never raises)."""
    cell = next((c for c in ctx.group.cells if c.cell_id == rec.cell_id), None)
    note = None
    try:
        (bundle_dir / REPRO).write_text(repro_script(ctx, cell, rec, copy_to=bundle_dir), encoding="utf-8",
                                        errors=ENCODE_ERRORS)
    except NotScriptable as exc:
        note = str(exc)
    except Exception as exc:  # noqa: BLE001 - a bundle without repro.py, saying why
        note = f"{type(exc).__name__}: {exc}"
    try:
        data_sets = write_test_data(ctx, bundle_dir) if ctx.feeds and getattr(ctx, "references", None) else []
    except Exception:  # noqa: BLE001 - a bundle without test data still holds the model and repro.py
        data_sets = []
    tolerance = (ctx.spec.atol, ctx.spec.rtol) if getattr(ctx, "spec", None) is not None else (None, None)
    try:
        from harness.worker.diagnose.layer_issue import layer_repro

        layer_lines = layer_repro(ctx, rec, bundle_dir)   # the blamed layer's own repro and note
    except Exception:  # noqa: BLE001 - the ISSUE.md is still written, without the layer's part
        layer_lines = []
    (bundle_dir / ISSUE).write_text(issue_text(rec, note, data_sets, tolerance, layer_lines), encoding="utf-8",
                                    errors=ENCODE_ERRORS)
    if note:
        (bundle_dir / "repro.json").write_text(json.dumps({"repro": None, "why": note}))
