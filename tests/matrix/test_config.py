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
        load_matrix(write(tmp_path, "\n".join(l for l in MINIMAL.splitlines() if not l.startswith("cases"))))


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
