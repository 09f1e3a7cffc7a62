"""MkDocs hook: the reference pages are generated from the code, so they cannot drift from it.

``<!-- generated: matrix-schema -->`` in a page becomes one table per section of matrix.yaml,
read from the pydantic schema of ``harness.matrix.config.Matrix`` (keys, types, defaults,
limits); ``<!-- generated: record-schema -->`` becomes the fields of ``harness.core.record``'s
``Record``, ``Parity`` and ``Latency`` dataclasses with the checks ``Record.from_dict`` applies.
The meaning of each key is written below, once; a key the code has and this file does not
describe (or describes and the code lacks) is a warning, which ``mkdocs build --strict`` turns
into a failed build, so a new matrix key or record field cannot ship undocumented.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the checkout's harness, also when mkdocs is an installed tool
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("mkdocs.plugins.reference")

# What each matrix.yaml key means (section -> key -> text). Keys, types, defaults and limits
# come from the schema; only the meaning is written here.
MATRIX_KEYS: dict[str, dict[str, str]] = {
    "Matrix": {
        "torch": "torch releases, one environment each: a version string or a [torch entry](#torch-entries)",
        "exporters": "export paths: `torchscript` (`dynamo=False`), `dynamo` (`dynamo=True`), `optimum` (Optimum's own export, transformers cases)",
        "opsets": "ONNX opsets requested from the exporter",
        "runtimes": "runtimes each file is run in: a name or a [runtime entry](#runtime-entries)",
        "cases": "cases: a group (`probes`, `real`, `transformers`, `timm`, `torchvision`, `transformers:bert,gpt2`), `file.py:function` (relative to the matrix file), `package.module:function`, or a [case entry](#case-entries)",
        "options": "extra axes, each a list of values (see [option axes](#option-axes))",
        "pipelines": "post-export pipelines, an axis: name → ordered steps applied to the exported file; `raw: []` (the default) is the file as exported ([Pipelines](pipelines.md))",
        "include": "extra cells outside the product of the lists (see [include entries](#include-entries))",
        "exclude": "rules over axes (`{exporter: dynamo, opset: 13}`); a list means any of; `~regex` matches by regular expression; a matching cell is not planned",
        "xfail": "known failures (see [xfail entries](#xfail-entries)); a matching failure is `xfail`, a matching pass `xpass`",
        "latency": "the timing protocol (see [latency](#latency))",
        "threads": "intra-op threads of every runtime and of torch",
        "cell_timeout_s": "a cell is `timeout` after this many CPU seconds, or this many wall seconds "
                          "when it gets almost no CPU (a hang), and at most 4× this in wall time "
                          "([Isolation](isolation.md))",
        "determinism": "export each group twice in two fresh processes and record whether the files "
                       "are identical ([Isolation](isolation.md))",
        "cell_memory_mb": "resident memory a worker's processes may reach while it runs a cell; null: half the machine's memory divided by `jobs`; 0: no limit; over it the cell is `crash` (`MemoryLimit`)",
        "log_max_mb": "each log keeps its first and last `log_max_mb / 2`",
        "jobs": "verdict workers at once (latency is timed alone, after them); null: one per CPU core; `--jobs N` overrides it",
        "install": "how environments are installed (see [install](#install))",
        "reduce": "at the end of the run, reduce every failing cell's file to the smallest graph that still fails",
        "reduce_timeout_s": "seconds per cell for `reduce`",
        "runtime_versions": "runtime → releases: each passing cell's exported file is also loaded and run "
                            "on every release listed, in runtime-only environments (no torch, no export); "
                            "`graph.runtime_versions` ([Runtime floors](runtime-floors.md))",
        "runtime_floor": "runtime → releases: the oldest listed release that loads each passing cell's file "
                         "and matches eager, by bisection; `graph.runtime_floor` "
                         "([Runtime floors](runtime-floors.md))",
        "deploy": "runtime → the release you ship: each passing cell's file is tried on it, and the gate "
                  "blocks a bump whose file fails there ([Runtime floors](runtime-floors.md))",
    },
    "TorchSpec": {
        "version": "the torch release, e.g. `2.13.0`; with `python: PATH` or `image`, the release expected there (checked up front)",
        "python": "Python of this environment (default: `install.python`); or the path of an existing interpreter, used as it is ([Existing environments](existing-environments.md)); with `image`, the interpreter inside it",
        "image": "a Docker image on this machine, used as it is ([Existing environments](existing-environments.md))",
        "numpy": "numpy pin (default: contemporary with the release)",
        "onnx": "onnx pin (default: one the release's exporter works with)",
        "onnxscript": "onnxscript pin (default: one the release's dynamo exporter works with)",
        "protobuf": "protobuf pin",
        "onnxslim": "onnxslim pin, for the `onnxslim` step (default 0.1.98, installed only where a pipeline uses it)",
        "onnxsim": "onnxsim pin, for the `onnxsim` step (default 0.8.1, installed only where a pipeline uses it)",
        "extras": "more requirements installed beside torch, e.g. `transformers==4.57.6`",
    },
    "RuntimeSpec": {
        "name": "the runtime (see [Runtimes](runtimes.md))",
        "version": "a release of the runtime's package; another version gets an environment of its own and the label `name@version`",
        "options": "runtime options, passed to its adapter",
    },
    "CaseEntry": {
        "target": "`file.py:function`, `package.module:function` or a probe name",
        "name": "the case's name in cell ids (default: the function's name)",
        "atol": "absolute tolerance of parity (default: the function's `atol`, else 1e-4)",
        "rtol": "relative tolerance of parity (default: the function's `rtol`, else 1e-3)",
        "data_files": "files the case reads that it does not import (weights, configs, vocabularies): "
                      "paths or globs relative to the matrix file; a change re-runs the case's cells "
                      "([Cell cache](cache.md))",
        "tolerances": "how the case's pipelines that end in fp16 or int8 are judged, over the defaults: "
                      "`{int8: {cosine: 0.98, top1: 0.8}, fp16: {atol: 0.05}}` ([Pipelines](pipelines.md))",
    },
    "OptionsAxes": {
        "constant_folding": "export with `do_constant_folding` on and/or off",
        "dynamic": "export the case's dynamic dims as dynamic and/or every dim static",
        "precision": "what the runtime is asked to compute in (`fp32`, `fp16`, `bf16`)",
        "dim_policy": "how dynamo marks dynamic dims: null (what torch does with `dynamic_axes` on that release), `dynamic`, `auto`, `named`",
        "optimize": "the dynamo exporter's `optimize=` (null: the release's default); TorchScript cells keep null ([Pipelines](pipelines.md))",
        "external_data": "the dynamo exporter's `external_data=`: one file or file + `.data`, recorded as `graph.layout` ([Pipelines](pipelines.md))",
    },
    "IncludeEntry": {
        "torch": "torch release of the extra cell (default: the first of `torch`)",
        "exporter": "its exporter (default: the first of `exporters`)",
        "opset": "its opset (default: the first of `opsets`)",
        "runtime": "its runtime (default: the first of `runtimes`)",
        "case": "its case (default: the first of `cases`)",
        "constant_folding": "its constant folding",
        "dynamic": "dynamic dims or static",
        "precision": "its precision",
        "dim_policy": "its dim policy",
        "pipeline": "its pipeline (a name of `pipelines`; default: the first)",
        "optimize": "its dynamo `optimize=`",
        "external_data": "its dynamo `external_data=`",
    },
    "XfailEntry": {
        "match": "the cells it applies to, as an `exclude` rule",
        "reason": "why it fails (shown in the report)",
        "link": "the upstream issue (http or https)",
    },
    "InstallConfig": {
        "python": "the default Python of every environment",
        "use_pip_config": "also use the find-links folders named in pip's configuration",
        "find_links": "folders of local wheels, used before any index",
        "index_url": "the package index (default: uv's, or `UV_INDEX_URL` / `PIP_INDEX_URL`)",
        "extra_index_urls": "further indexes",
    },
    "LatencyProtocol": {
        "enabled": "time passing cells at all",
        "warmup_runs": "at least this many warm-up calls",
        "warmup_s": "and at least this long",
        "warmup_max_s": "warm-up ends after this long even if not stable",
        "warmup_windows": "warm-up ends when the medians of this many consecutive windows agree",
        "warmup_window_runs": "calls per window, at least",
        "warmup_window_s": "seconds per window, at least",
        "warmup_tolerance": "how closely the window medians must agree (relative)",
        "min_runs": "timed calls, at least",
        "early_runs": "from this many calls on, sampling may stop before `min_runs` where the spread allows",
        "early_confidence": "the stricter confidence the interval must reach within ± `rel_ci` to stop before `min_runs`",
        "min_time_s": "timed seconds, at least",
        "max_time_s": "sampling stops here (`stop: time_cap`)",
        "max_runs": "or here (`stop: max_runs`)",
        "rel_ci": "sampling stops when the median's confidence interval lies within ± this of it (`stop: converged`)",
        "confidence": "the confidence level of that interval",
        "unstable_spread": "a robust spread (IQR / 1.349 / median) above this flags the timing unstable (so does a median interval wider than `rel_ci`)",
        "confirm": "time each passing cell again in a second fresh latency worker (a short protocol) and settle figures that disagree over more processes ([Report](report.md))",
        "confirm_processes": "fresh latency workers more for a cell whose two figures disagree (at least 2)",
    },
}

SECTIONS = [  # (model, heading, how it is written in matrix.yaml)
    ("Matrix", "Top-level keys", ""),
    ("TorchSpec", "torch entries", "`torch: [\"2.6.0\", {version: \"2.13.0\", numpy: \"2.3.5\"}, {python: /opt/venv/bin/python}, {image: \"team/deploy:2026-11\"}]`"),
    ("RuntimeSpec", "runtime entries", "`runtimes: [ort-cpu, {name: openvino, version: \"2026.3.1\"}]`"),
    ("CaseEntry", "case entries", "`cases: [probes, {target: \"pkg.mod:fn\", name: big, atol: 1e-3}]`"),
    ("OptionsAxes", "option axes", "`options: {dynamic: [true, false], dim_policy: [null, auto]}`"),
    ("IncludeEntry", "include entries", "`include: [{torch: \"2.13.0\", exporter: dynamo, opset: 20, case: mha}]`"),
    ("XfailEntry", "xfail entries", "`xfail: [{match: {case: mha, opset: 13}, reason: ..., link: https://...}]`"),
    ("InstallConfig", "install", "`install: {find_links: [/opt/wheels]}`"),
    ("LatencyProtocol", "latency", "`latency: {min_runs: 200, rel_ci: 0.01}`"),
]

RECORD_FIELDS: dict[str, dict[str, str]] = {
    "Record": {
        "schema": "schema version of the record (older ones are migrated on read, newer ones refused)",
        "run_id": "the run that holds it",
        "cell_id": "the cell's identity: case, torch, exporter, opset, runtime and the options that differ from the default",
        "case": "the case's name",
        "torch": "the torch release",
        "exporter": "`torchscript`, `dynamo` or `optimum`",
        "opset": "the opset requested",
        "opset_actual": "the opset the file declares; where it differs from `opset` the cell is marked "
                        "\"asked 13, got 18\" and never counted as the requested opset's configuration "
                        "([Advise](advise.md), [Gate](gate.md))",
        "runtime": "the runtime label (`ort-cpu`, `openvino@2026.3.1`)",
        "env": "the environment the cell ran in",
        "status": "`pass`, `fail`, `xfail`, `xpass`, `skip`, `crash`, `timeout`, or `error`: the matrix's own "
                  "code failed on the cell (no verdict on the model, counted apart, never reused; "
                  "[Report](report.md#the-matrixs-own-errors))",
        "stage": "the first stage that failed: `reference`, `export`, `check`, `load`, `run`, `parity`, `latency`",
        "error": "the exception's first line plus its root cause",
        "signature": "`stage:hash` of the normalised error: equal failures share it",
        "hint": "what usually fixes this failure",
        "reason": "why a cell was skipped; on an `error`, that it is the matrix's fault",
        "options": "the export and runtime options of the cell (`dim_policy`, `dim_marking`, `precision`, ...)",
        "parity": "the comparison with torch eager (below)",
        "latency_ms": "the timing in milliseconds (below)",
        "versions": "the versions of torch, the exporter's packages and the runtime",
        "duration_s": "seconds per stage",
        "graph": "facts of the exported file: `opset`, `ir_version`, `nodes`, `ops`, `bytes`, `io` (inputs and outputs: name, dtype, shape), `specialised` (dims the file fixes, or the exported program pins where growing the dim alone fails: [Diagnosis](diagnosis.md#dims-fixed-by-the-exporter)), `export_specialised` (dims torch fixed while exporting: a silent re-export or the error, with the model's line and the remedy), `zero_one` (failing dims with an example size of 0 or 1), `reduced` (after `reduce`), `optimum_validation`, `runtime_facts`, `export_call` (the `torch.onnx.export(...)` call as Python source, [Advise](advise.md)), `onnx_file` (the file's `sha256`, `ir_version`, `opsets`, `export_group`), `runtime_floor`, `runtime_versions`, `deploy` (other runtime releases tried on the file: [Runtime floors](runtime-floors.md))",
        "notes": "what else happened (a retry, NaN at the same places as eager, a dim fixed by the exporter)",
        "log": "the log of its export group",
        "bundle": "the folder with the failing cell's files",
        "repro": "a one-line command that re-runs just this cell",
        "finished_at": "when the cell finished (Unix time)",
        "cache_key": "digest of everything that decides the result (null: never reused)",
        "cached_from": "the run it was taken from by the cell cache",
        "wall_s": "wall-clock seconds the cell's verdict took (its share of the group's shared stages included)",
        "cpu_s": "CPU seconds the cell's processes got for it; the timeout rule counts these ([Isolation](isolation.md))",
        "case_files": "every file the case loaded from outside the environment (modules it imported, "
                      "files it opened, declared data files) → content hash; a stored cell is reused "
                      "only while each is unchanged ([Cell cache](cache.md))",
        "blame": "whose bug a failing cell is: `{party, repository, reason, evidence, source, "
                 "divergence, seconds}` ([Blame](blame.md)); none on passing cells and older records",
        "passes_not_run": "optional passes asked of this cell that could not be made, pass "
                          "(`runtime_floor`, `runtime_versions`, `deploy`, `reduce`, `blame`, `bundle`) → why; "
                          "written only when there is one ([Robustness](robustness.md#an-optional-pass-that-cannot-run-is-said))",
        "export_made": "how the cell's file was made: `{how: reused-capture, shared_by, capture_s, sha256}` "
                       "from one capture shared by the opsets of a case, release and options, or "
                       "`{how: per-opset, reason, sha256}`; `sha256`: the file's digest "
                       "([Where the time goes](performance.md)); none on older records",
    },
    "Parity": {
        "max_abs": "largest absolute difference from eager over every output and shape",
        "max_rel": "largest relative difference",
        "atol": "the absolute tolerance applied",
        "rtol": "the relative tolerance applied",
        "shapes": "one entry per shape checked (the example shape, the second shape); per output `noise_floor` and `noise_ratio` where the model's own noise was measured",
        "noise": "the model's own float32 noise ([Report](report.md#tolerances)): `method` (`float64`, `op-order`, or null with `error`), `judged` (fp32 cells only), the worst `ratio` of a difference to its `floor`",
    },
    "Latency": {
        "median": "median of the timed calls",
        "p90": "90th percentile",
        "min": "fastest call",
        "mean": "mean",
        "iqr": "interquartile range",
        "cv": "coefficient of variation (information: single slow calls inflate it)",
        "spread": "robust spread: interquartile range / 1.349 / median (the CV of a normal distribution with that IQR; up to a quarter of slow calls leave it alone)",
        "unstable": "the spread is above `latency.unstable_spread`, the median's interval is wider than ±`latency.rel_ci`, or two fresh processes disagree",
        "unstable_why": "which of those, in words (`robust spread 7.1% > 5%`, `two fresh processes disagree (0.015 vs 0.024 ms): the median of 6 processes`)",
        "processes": "the medians (ms) of the fresh latency workers that timed the cell, the protocol's own first; where two disagreed, `median` is the median of all of them",
        "bimodal": "those processes split into two modes (shown ‡ in the matrix)",
        "modes": "the two modes' medians (ms), lower first",
        "same_file_as": "the cell whose timing this is: the same file, feeds, runtime and runtime options, timed once for both in each latency worker ([Report](report.md))",
        "iterations": "timed calls",
        "threads": "intra-op threads",
        "ci_low": "lower end of the median's confidence interval",
        "ci_high": "upper end",
        "confidence": "its confidence level",
        "stop": "why sampling ended: `converged`, `time_cap`, `max_runs`",
        "warmup_iterations": "warm-up calls",
        "warmup_stable": "warm-up ended on stability (not on `warmup_max_s`)",
        "floor_ms": "the binding overhead: the runtime binding's own median call on a one-element Identity model (`Latency.binding_overhead_ms` in Python; the key predates the rename)",
        "loaded": "the machine was busy with other work while the calls were timed (others' CPU over 25 % of the machine, or steal over 5 %); the gate times such a cell again interleaved rather than compare this figure ([Report](report.md#latency-on-a-loaded-machine))",
        "load": "what that was decided from: `other_cpu` and `steal` (shares of the machine over the timing window), `cpu_share` (the timing process's CPU time / wall time), `loadavg`, `cpus`, `window_s`",
        "samples": "at most 1,000 samples: all of them in time order, else evenly spaced order statistics",
    },
}


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return next((f"[{h}](#{h.replace(' ', '-')})" for m, h, _ in SECTIONS if m == name), name)
    if "anyOf" in schema:
        return " or ".join(dict.fromkeys(_type(s) for s in schema["anyOf"]))
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"mapping to {_type(extra)}" if isinstance(extra, dict) and extra else "mapping"
    return {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
            "null": "null"}.get(kind, "any")


def _limits(schema: dict[str, Any]) -> str:
    out = []
    for part in [schema, *schema.get("anyOf", [])]:
        for key, text in (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"),
                          ("minItems", "at least {} item(s)"), ("minLength", "at least {} character(s)")):
            if key in part:
                out.append(text.format(part[key]))
    return ", ".join(out)


def _default(name: str, field: Any, schema: dict[str, Any]) -> str:
    if field.is_required():
        return "**required**"
    if "default" in schema:
        return f"`{json.dumps(schema['default'])}`"
    try:
        value = field.get_default(call_default_factory=True)
    except Exception:  # noqa: BLE001 - a factory that needs context: say so
        return "(computed)"
    if hasattr(value, "model_dump"):
        return "see below"
    if dataclasses.is_dataclass(value):
        return "see below"
    if isinstance(value, list):
        value = [v.model_dump(exclude_defaults=True) if hasattr(v, "model_dump") else v for v in value]
        value = [next(iter(v.values())) if isinstance(v, dict) and len(v) == 1 else v for v in value]
    return f"`{json.dumps(value)}`"


def _table(rows: list[list[str]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("\n", " ") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _check(kind: str, described: dict[str, dict[str, str]], actual: dict[str, list[str]]) -> list[str]:
    problems = []
    for model, keys in actual.items():
        words = described.get(model, {})
        problems += [f"{kind} {model}.{k}: in the code, not described in docs/hooks.py" for k in keys if k not in words]
        problems += [f"{kind} {model}.{k}: described in docs/hooks.py, not in the code" for k in words if k not in keys]
    return problems


def matrix_reference() -> tuple[str, list[str]]:
    """The matrix.yaml reference as markdown, and the keys that lack (or have stale) meanings."""
    from harness.matrix import config

    schema = config.Matrix.model_json_schema()
    defs = schema["$defs"]
    models = {name: getattr(config, name, None) for name, _, _ in SECTIONS}
    models["LatencyProtocol"] = None
    parts, actual = [], {}
    for name, heading, example in SECTIONS:
        part = schema if name == "Matrix" else defs[name]
        props = part["properties"]
        actual[name] = list(props)
        model = models[name]
        fields = model.model_fields if model is not None else {}
        rows = []
        for key, prop in props.items():
            if key in fields:
                default = _default(key, fields[key], prop)
            else:
                default = f"`{json.dumps(prop['default'])}`" if "default" in prop else "**required**"
            if key in part.get("required", []):
                default = "**required**"
            rows.append([f"`{key}`", _type(prop), default, _limits(prop),
                         MATRIX_KEYS.get(name, {}).get(key, "")])
        parts.append(f"## {heading}\n\n" + (f"{example}\n\n" if example else "")
                     + _table(rows, ["key", "type", "default", "limits", "meaning"]))
    return "\n\n".join(parts) + "\n", _check("matrix key", MATRIX_KEYS, actual)


def _annotation(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "").replace("|", "or")


def record_reference() -> tuple[str, list[str]]:
    """The result record's fields as markdown, and the fields that lack (or have stale) meanings."""
    from harness.core import record

    required = set(record._REQUIRED) | {"status"}
    checks = {**record._REQUIRED, **record._OPTIONAL}
    parts, actual = [], {}
    for name, key in (("Record", None), ("Parity", "parity"), ("Latency", "latency_ms")):
        cls = getattr(record, name)
        hints = typing.get_type_hints(cls, vars(record))
        # The stored key, where an attribute was renamed after schema v1 stored it (floor_ms).
        stored = record.LATENCY_KEYS if name == "Latency" else {}
        names = [stored.get(f.name, f.name) for f in dataclasses.fields(cls) if f.name != "extra"]
        actual[name] = names
        nested = {"Parity": record._PARITY, "Latency": record._LATENCY}.get(name, checks)
        rows = []
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            tp = str(hints[f.name]).replace("typing.", "").replace("harness.core.status.", "")
            tp = getattr(hints[f.name], "__name__", tp) if not str(hints[f.name]).startswith("typing") \
                and "|" not in str(hints[f.name]) and "[" not in str(hints[f.name]) else tp
            tp = tp.replace(" | ", " or ").replace("None", "null")
            key_name = stored.get(f.name, f.name)
            check = nested.get(key_name, (None, ""))[1] if key_name in nested else ""
            if name == "Record" and f.name == "status":
                check = "a known status"
            if name == "Record" and f.name == "schema":
                check = "an integer, at most the reader's"
            req = "yes" if name == "Record" and f.name in required else ""
            rows.append([f"`{key_name}`", f"`{tp}`", req, check, RECORD_FIELDS.get(name, {}).get(key_name, "")])
        title = "The record" if key is None else f"`{key}`"
        parts.append(f"## {title}\n\n" + _table(rows, ["field", "type", "required", "checked on read", "meaning"]))
    return "\n\n".join(parts) + "\n", _check("record field", RECORD_FIELDS, actual)


GENERATORS = {"matrix-schema": matrix_reference, "record-schema": record_reference}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name, generate in GENERATORS.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            text, problems = generate()
            for problem in problems:
                log.warning(problem)
            markdown = markdown.replace(marker, text)
    return markdown
