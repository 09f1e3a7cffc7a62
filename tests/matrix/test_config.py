from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from harness.matrix.config import ConfigError, load_matrix

MINIMAL = """
torch: ["2.6.0", "2.13.0"]
exporters: [torchscript, dynamo]
opsets: [13, 17, 18]
runtimes: [ort-cpu]
cases: [mha, "path/to/models.py:make_model", "mypkg.models:factory"]
"""


def write(tmp_path: Path, text: str) -> Path:
    """The matrix file, beside the case file MINIMAL names (checked with ast, never imported)."""
    models = tmp_path / "path" / "to" / "models.py"
    models.parent.mkdir(parents=True, exist_ok=True)
    models.write_text("import torch\n\ndef make_model():\n    return torch.nn.Linear(2, 2), (torch.zeros(1, 2),)\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_minimal_form_is_accepted(tmp_path):
    m = load_matrix(write(tmp_path, MINIMAL))
    assert [t.version for t in m.torch] == ["2.6.0", "2.13.0"]
    assert [c.label for c in m.cases] == ["mha", "make_model", "factory"]
    assert m.runtimes[0].label == "ort-cpu"


def test_shipped_default_matrix_spans_the_dynamo_switch():
    from packaging.version import Version

    m = load_matrix(ROOT / "matrix.yaml")
    versions = sorted(Version(t.version) for t in m.torch)
    assert len(versions) >= 3
    assert versions[0] < Version("2.9") <= versions[-1]
    assert {"torchscript", "dynamo"} <= set(m.exporters)


def test_probe_group_expands(tmp_path):
    m = load_matrix(write(tmp_path, MINIMAL.replace("cases: [mha, ", "cases: [probes, ")))
    labels = [c.label for c in m.cases]
    assert {"mha", "repeat_interleave", "conv_bn"} <= set(labels)


@pytest.mark.parametrize("change, key, expected", [
    ("opsets: [13, 17, 18]", "opsets: [13, 99]", "opsets[1]"),
    ("runtimes: [ort-cpu]", "runtimes: [onnxrt]", "runtimes[0]"),
    ('torch: ["2.6.0", "2.13.0"]', 'torch: ["2.6.0", "two"]', "torch[1]"),
    ("exporters: [torchscript, dynamo]", "exporters: [torchscript, jit]", "exporters[1]"),
])
def test_errors_name_file_key_and_expectation(tmp_path, change, key, expected):
    path = write(tmp_path, MINIMAL.replace(change, key))
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    msg = str(err.value)
    assert str(path) in msg
    assert f"key '{expected}'" in msg
    assert "expected" in msg.lower() or "input should be" in msg.lower()


def test_unknown_top_level_key_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'opset'.*[Ee]xtra"):
        load_matrix(write(tmp_path, MINIMAL + "opset: [13]\n"))


def test_missing_required_key(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'cases': Field required"):
        load_matrix(write(tmp_path, "\n".join(ln for ln in MINIMAL.splitlines() if not ln.startswith("cases"))))


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "torch: [2.6.0\nopsets: [13]\n")
    with pytest.raises(ConfigError, match=r"matrix.yaml: line \d+"):
        load_matrix(path)


def test_exclude_with_unknown_axis(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'exclude\[0\]'.*unknown axis 'runtimee'"):
        load_matrix(write(tmp_path, MINIMAL + "exclude: [{runtimee: ort-cpu}]\n"))


def test_xfail_needs_reason_and_link(tmp_path):
    with pytest.raises(ConfigError, match=r"xfail\[0\]\.link"):
        load_matrix(write(tmp_path, MINIMAL + "xfail: [{match: {case: mha}, reason: known bug}]\n"))


def test_duplicate_case_names(tmp_path):
    with pytest.raises(ConfigError, match="repeated"):
        load_matrix(write(tmp_path, MINIMAL.replace('"mypkg.models:factory"', '"a.py:mha"')))


def test_runtime_versions_and_companion_overrides(tmp_path):
    text = MINIMAL.replace("runtimes: [ort-cpu]", 'runtimes: [ort-cpu, {name: ort-cpu, version: "1.20.1"}]')
    text = text.replace('torch: ["2.6.0", "2.13.0"]', 'torch: ["2.6.0", {version: "2.13.0", numpy: "<2.3"}]')
    m = load_matrix(write(tmp_path, text))
    assert [r.label for r in m.runtimes] == ["ort-cpu", "ort-cpu@1.20.1"]
    assert m.torch[1].numpy == "<2.3"


# --- Malformed matrix files through the command line: one line naming file and key, exit 2,
# before anything is installed (execute is never reached, the environments folder stays empty).

BASE = {"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18], "runtimes": ["ort-cpu"],
        "cases": ["mha"]}


def cfg(**changes) -> str:
    """BASE with keys replaced (None removes a key), as YAML."""
    import yaml

    data = {**BASE, **changes}
    return yaml.safe_dump({k: v for k, v in data.items() if v is not None}, sort_keys=False)


CASE_FILE = "import torch\n\ndef good():\n    return torch.nn.Linear(2, 2), (torch.zeros(1, 2),)\n"

# (id, file content: YAML text, bytes, or DIR for a directory; the key the line must name, or
# None where the file as a whole is the problem; text the line must hold)
MALFORMED = [
    ("directory", "DIR", None, "is a directory"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\xfd", None, "not UTF-8"),
    ("nul-bytes", b"torch: ['2.13.0']\x00\x00\n", None, "NUL"),
    ("empty", "", "<top>", "expected a mapping"),
    ("top-level-list", "- torch\n- opsets\n", "<top>", "expected a mapping"),
    ("top-level-scalar", "just a string\n", "<top>", "expected a mapping"),
    ("yaml-syntax", "torch: [2.6.0\nopsets: [13]\n", None, "not valid YAML"),
    ("yaml-duplicate-key", cfg() + "opsets: [17]\n", "opsets", "given twice"),
    ("yaml-duplicate-nested-key", cfg(latency={"enabled": False}) + "  enabled: true\n", "latency.enabled",
     "given twice"),
    ("yaml-duplicate-key-in-a-list", cfg().replace("- mha", "- {target: mha, name: a, name: b}"),
     "cases[0].name", "given twice"),
    ("yaml-python-tag", "torch: !!python/object/apply:os.system ['true']\n", None, "not valid YAML"),
    ("missing-cases", cfg(cases=None), "cases", "Field required"),
    ("unknown-top-key", cfg(opset=[13]), "opset", "Extra inputs"),
    ("torch-not-a-version", cfg(torch=["2.13.0", "two"]), "torch[1]", "torch release"),
    ("torch-path", cfg(torch=["../../etc/passwd"]), "torch[0]", "torch release"),
    ("torch-empty", cfg(torch=[]), "torch", "at least 1"),
    ("torch-duplicate", cfg(torch=["2.13.0", "2.13.0"]), "torch", "once"),
    ("torch-unknown-key", cfg(torch=[{"version": "2.13.0", "cuda": "12.4"}]), "torch[0].cuda", "Extra inputs"),
    ("python-2.7", cfg(torch=[{"version": "2.13.0", "python": "2.7"}]), "torch[0].python", "3.9 or newer"),
    # A path is an existing interpreter (docs/existing-environments.md): one that is not there is refused.
    ("python-path", cfg(torch=[{"version": "2.13.0", "python": "/nonexistent/bin/python3"}]), "torch[0].python",
     "expected an existing interpreter"),
    ("install-python-3.8", cfg(install={"python": "3.8"}), "install.python", "3.9 or newer"),
    ("numpy-not-a-version", cfg(torch=[{"version": "2.13.0", "numpy": "banana"}]), "torch[0].numpy", "expected a version"),
    ("onnx-path", cfg(torch=[{"version": "2.13.0", "onnx": "../onnx.whl"}]), "torch[0].onnx", "expected a version"),
    ("extras-not-requirements", cfg(torch=[{"version": "2.13.0", "extras": ["not a requirement!!"]}]),
     "torch[0].extras[0]", "requirement"),
    ("exporter-unknown", cfg(exporters=["jit"]), "exporters[0]", "torchscript"),
    ("exporters-empty", cfg(exporters=[]), "exporters", "at least 1"),
    ("opset-99", cfg(opsets=[13, 99]), "opsets[1]", "between 7 and 26"),
    ("opset-6", cfg(opsets=[6]), "opsets[0]", "between 7 and 26"),
    ("opset-word", cfg(opsets=["thirteen"]), "opsets[0]", "integer"),
    ("opset-fraction", cfg(opsets=[13.5]), "opsets[0]", "integer"),
    ("runtime-unknown", cfg(runtimes=["onnxrt"]), "runtimes[0]", "expected one of"),
    ("runtime-version-path", cfg(runtimes=[{"name": "ort-cpu", "version": "../../x"}]),
     "runtimes[0].version", "expected a release"),
    ("runtime-version-shell", cfg(runtimes=[{"name": "ort-cpu", "version": "1.2; rm -rf /"}]),
     "runtimes[0].version", "expected a release"),
    ("runtime-options-not-a-dict", cfg(runtimes=[{"name": "ort-cpu", "options": 5}]),
     "runtimes[0].options", "dictionary"),
    ("probe-unknown", cfg(cases=["mhaa"]), "cases[0]", "unknown probe"),
    ("case-file-missing", cfg(cases=["missing.py:fn"]), "cases[0]", "not found"),
    ("case-function-missing", cfg(cases=["models.py:nope"]), "cases[0]", "no top-level 'nope'"),
    ("case-file-syntax-error", cfg(cases=["broken.py:good"]), "cases[0]", "does not parse"),
    ("case-module-invalid", cfg(cases=["my pkg.mod:fn"]), "cases[0]", "importable module"),
    ("case-negative-atol", cfg(cases=[{"target": "mha", "atol": -1}]), "cases[0].atol", "greater than or equal"),
    ("case-empty-name", cfg(cases=[{"target": "mha", "name": ""}]), "cases[0].name", "at least 1"),
    ("case-duplicate-names", cfg(cases=["mha", "models.py:mha"]), "cases", "unique"),
    # Names become cell ids, file names and report text: bounded, printable, one direction.
    ("case-name-1000-chars", cfg(cases=[{"target": "mha", "name": "x" * 1000}]), "cases[0].name",
     "at most 100 characters"),
    ("case-name-nul", cfg(cases=[{"target": "mha", "name": "a\x00b"}]), "cases[0].name", "NUL"),
    ("case-name-escape-sequence", cfg(cases=[{"target": "mha", "name": "a\x1b[31mred"}]), "cases[0].name",
     "control characters"),
    ("case-name-newline", cfg(cases=[{"target": "mha", "name": "two\nlines"}]), "cases[0].name",
     "control characters"),
    ("case-name-bidi-override", cfg(cases=[{"target": "mha", "name": "evil\u202egnp.exe"}]), "cases[0].name",
     "bidirectional"),
    ("case-name-zero-width", cfg(cases=[{"target": "mha", "name": "mh\u200ba"}]), "cases[0].name", "printable"),
    ("case-name-padded", cfg(cases=[{"target": "mha", "name": " mha "}]), "cases[0].name", "white space"),
    ("case-function-150-chars", cfg(cases=["models.py:" + "f" * 150]), "cases[0]", "at most 100 characters"),
    ("include-case-function-150-chars", cfg(include=[{"case": "models.py:" + "f" * 150}]), "include[0].case",
     "at most 100 characters"),
    ("include-opset-99", cfg(include=[{"opset": 99}]), "include[0].opset", "between 7 and 26"),
    ("include-exporter-bogus", cfg(include=[{"exporter": "bogus"}]), "include[0].exporter", "torchscript"),
    ("include-runtime-unknown", cfg(include=[{"runtime": "onnxrt"}]), "include[0].runtime", "runtime"),
    ("include-torch-invalid", cfg(include=[{"torch": "abc"}]), "include[0].torch", "release version"),
    ("include-unknown-axis", cfg(include=[{"opsett": 18}]), "include[0].opsett", "Extra inputs"),
    ("include-case-unknown", cfg(include=[{"case": "nosuchcase"}]), "include[0].case", "a built-in probe"),
    ("include-case-file-missing", cfg(include=[{"case": "gone.py:fn"}]), "include[0].case", "not found"),
    ("include-precision-bogus", cfg(include=[{"precision": "fp8"}]), "include[0].precision", "fp32"),
    ("exclude-unknown-axis", cfg(exclude=[{"runtimee": "ort-cpu"}]), "exclude[0]", "unknown axis"),
    ("exclude-empty-rule", cfg(exclude=[{}]), "exclude[0]", "at least one axis"),
    ("exclude-bad-regex", cfg(exclude=[{"case": "~[unclosed"}]), "exclude[0]", "regular expression"),
    ("xfail-javascript-link", cfg(xfail=[{"match": {"case": "mha"}, "reason": "known bug",
                                          "link": "javascript:alert(1)"}]), "xfail[0].link", "http"),
    ("xfail-no-link", cfg(xfail=[{"match": {"case": "mha"}, "reason": "known bug"}]), "xfail[0].link", "required"),
    ("xfail-empty-match", cfg(xfail=[{"match": {}, "reason": "known bug", "link": "https://x.org/1"}]),
     "xfail[0].match", "at least one axis"),
    ("xfail-unknown-axis", cfg(xfail=[{"match": {"cas": "mha"}, "reason": "known bug", "link": "https://x.org/1"}]),
     "xfail[0].match", "unknown axis"),
    ("threads-zero", cfg(threads=0), "threads", "greater than or equal"),
    ("jobs-zero", cfg(jobs=0), "jobs", "greater than or equal"),
    ("jobs-text", cfg(jobs="many"), "jobs", "integer"),
    ("timeout-negative", cfg(cell_timeout_s=-1), "cell_timeout_s", "greater than"),
    ("timeout-nan", cfg().replace("cases:", "cell_timeout_s: .nan\ncases:"), "cell_timeout_s", "finite"),
    ("latency-min-runs-zero", cfg(latency={"min_runs": 0}), "latency", "min_runs"),
    ("latency-unknown-key", cfg(latency={"runs": 5}), "latency.runs", "Unexpected keyword"),
    ("precision-unknown", cfg(options={"precision": ["fp8"]}), "options.precision[0]", "fp32"),
    ("options-empty-axis", cfg(options={"dynamic": []}), "options.dynamic", "at least 1"),
    ("index-url-ftp", cfg(install={"index_url": "ftp://mirror/simple"}), "install.index_url", "URL"),
    ("install-unknown-key", cfg(install={"mirror": "x"}), "install.mirror", "Extra inputs"),
]


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run `python -m harness matrix` in-process on a file; nothing may reach execution."""
    from harness import cli as cli_module
    from harness.run import execute

    envs = tmp_path / "envs"
    monkeypatch.setenv("HARNESS_ENVS_DIR", str(envs))
    monkeypatch.setattr(execute, "execute", lambda *a, **k: pytest.fail("a malformed matrix reached execution"))
    (tmp_path / "models.py").write_text(CASE_FILE + "\ndef mha():\n    return good()\n")
    (tmp_path / "broken.py").write_text("def good(:\n")

    def run(content, *args: str) -> tuple[int, list[str], Path]:
        path = tmp_path / "matrix.yaml"
        if content == "DIR":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        rc = cli_module.main(["--reports", str(tmp_path / "reports"), "matrix", "--config", str(path),
                              "--output", str(tmp_path / "run"), *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert not (tmp_path / "run").exists() and not envs.exists(), "something was created"
        return rc, err, path

    return run


def test_malformed_table_is_large_and_distinct():
    assert len(MALFORMED) >= 40 and len({m[0] for m in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize("content, key, text", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_matrix_is_one_line_exit_2(cli, content, key, text):
    rc, err, path = cli(content)
    assert rc == 2
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith(f"error: {path}") and text in line, line
    if key is not None:
        assert f"key '{key}'" in line, line
    assert "Traceback" not in line


def test_output_that_is_a_file_is_one_line_exit_2(cli, tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    rc, err, _ = cli(cfg(), "--output", str(target))
    assert rc == 2 and err == [f"error: --output {target}: is a file; expected a directory"]


def test_case_file_function_found_without_importing_it(tmp_path):
    """A case file is read with ast: an import that fails (no torch in the runner) is fine, and
    functions, classes, assignments and imports all count as defined."""
    (tmp_path / "m.py").write_text("import not_installed_anywhere\nfrom x import made as imported\n"
                                   "def f(): pass\nclass C: pass\nalias = f\ntry:\n    import y\n"
                                   "except ImportError:\n    def fallback(): pass\n")
    for fn in ("f", "C", "alias", "imported", "fallback"):
        path = tmp_path / "matrix.yaml"
        path.write_text(cfg(cases=[f"m.py:{fn}"]))
        m = load_matrix(path)
        assert m.cases[0].target == f"{tmp_path / 'm.py'}:{fn}"


def test_include_entries_plan_like_before(tmp_path):
    """Validated include entries still add the cell they describe, and the matrix hash of a file
    with include entries is what it was as plain dicts (run ids and resume checks unchanged)."""
    from harness.matrix.config import matrix_hash
    from harness.matrix.plan import build_plan

    path = tmp_path / "matrix.yaml"
    path.write_text(cfg(include=[{"torch": "2.13.0", "exporter": "torchscript", "opset": 20, "case": "mha"}]))
    m = load_matrix(path)
    ids = {c.cell_id for c in build_plan(m).cells}
    assert ids == {"torch2.13.0-mha-dynamo-op18-ort-cpu", "torch2.13.0-mha-torchscript-op20-ort-cpu"}
    assert m.model_dump(mode="json")["include"] == [{"torch": "2.13.0", "exporter": "torchscript",
                                                     "opset": 20, "case": "mha"}]
    assert len(matrix_hash(m)) == 16


# Files that are well-formed but ask for what the package index does not have: found by resolving
# every environment with uv (metadata only) before the first one is built. Needs the index.
UNINSTALLABLE = [
    ("torch-9.9.9", cfg(torch=["2.13.0", "9.9.9"]), "torch[1]", "no version of torch==9.9.9"),
    ("numpy-0.0.1", cfg(torch=[{"version": "2.13.0", "numpy": "0.0.1"}]), "torch[0].numpy", "numpy==0.0.1"),
    ("python-3.99", cfg(torch=[{"version": "2.13.0", "python": "3.99"}]), "torch[0].python", "Python 3.99"),
    ("runtime-0.0.1", cfg(runtimes=["ort-cpu", {"name": "ort-cpu", "version": "0.0.1"}]),
     "runtimes[1].version", "onnxruntime==0.0.1"),
    ("extra-unknown", cfg(torch=[{"version": "2.13.0", "extras": ["harness-no-such-package-4f2a==1.0"]}]),
     "torch[0].extras[0]", "harness-no-such-package-4f2a"),
    # Runtime releases tried on the files (runtime-only environments): a release the index lacks
    # is bad input, never "this release cannot read the file" after the run.
    ("floor-1.17.9", cfg(runtime_floor={"ort-cpu": ["1.16.3", "1.18.1", "1.17.9"]}),
     "runtime_floor.ort-cpu[2]", "onnxruntime==1.17.9"),
    ("deploy-and-versions-0.0.9", cfg(runtime_versions={"ort-cpu": ["v0.0.9"]}, deploy={"ort-cpu": "0.0.9.0"}),
     "runtime_versions.ort-cpu[0]', 'deploy.ort-cpu", "onnxruntime==0.0.9"),
]


@pytest.mark.parametrize("content, key, text", [m[1:] for m in UNINSTALLABLE], ids=[m[0] for m in UNINSTALLABLE])
def test_uninstallable_matrix_is_one_line_exit_2_before_any_install(cli, content, key, text):
    rc, err, path = cli(content)
    assert rc == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {path}: key '{key}': ") and text in err[0], err[0]


def test_only_with_a_broken_regex_is_one_line_exit_2(cli):
    rc, err, _ = cli(cfg(), "--only", "case=~[")
    assert rc == 2 and len(err) == 1 and "--only: case='~['" in err[0]


@pytest.mark.parametrize("args, text", [(["--jobs", "0"], "--jobs: expected a whole number >= 1"),
                                        (["--jobs", "two"], "--jobs: expected a whole number >= 1"),
                                        (["--fresh=sometimes"], "--fresh: invalid choice")])
def test_bad_jobs_or_fresh_exit_2_before_anything_runs(cli, capsys, args, text):
    with pytest.raises(SystemExit) as info:
        cli(cfg(), *args)
    assert info.value.code == 2 and text in capsys.readouterr().err


def test_the_old_unstable_cv_key_is_read_as_the_robust_spread_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="unstable_spread"):
        m = load_matrix(write(tmp_path, MINIMAL + "latency: {unstable_cv: 0.08}\n"))
    assert m.latency.unstable_spread == 0.08
    with pytest.raises(ConfigError, match="latency"):
        load_matrix(write(tmp_path, MINIMAL + "latency: {unstable_cv: -1}\n"))
