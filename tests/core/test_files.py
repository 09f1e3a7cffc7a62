"""Case files by content (harness.core.files) and what the worker counts as loaded by a case
(harness.run.loaded): modules and opened files outside the environment, never the files the
case wrote itself."""
from __future__ import annotations

import importlib
import json
import sys

from harness.core.files import (
    case_file_key,
    changed_case_files,
    differing_case_files,
    expand_declared,
    file_digest,
)
from harness.run.loaded import CaseFiles


def test_digest_names_and_changes(tmp_path):
    a = tmp_path / "pkg" / "a.py"
    a.parent.mkdir()
    a.write_text("x = 1\n")
    assert case_file_key(a, tmp_path) == "pkg/a.py"
    outside = tmp_path.parent / f"{tmp_path.name}-other.py"
    outside.write_text("")
    assert case_file_key(outside, tmp_path) == str(outside.resolve())
    files = {"pkg/a.py": file_digest(a), str(outside.resolve()): file_digest(outside)}
    assert changed_case_files(files, tmp_path) == []
    a.write_text("x = 2\n")
    assert changed_case_files(files, tmp_path) == ["pkg/a.py"]
    assert differing_case_files({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b"]
    assert file_digest(tmp_path / "missing") is None


def test_declared_globs_expand_to_existing_files(tmp_path):
    (tmp_path / "w").mkdir()
    for name in ("w/1.bin", "w/2.bin", "w/x.txt"):
        (tmp_path / name).write_bytes(b"1")
    assert [p.rsplit("/", 1)[-1] for p in expand_declared(["w/*.bin", "nothing/*"], tmp_path)] == ["1.bin", "2.bin"]


def test_the_tracker_sees_imports_and_reads_but_not_the_environment_or_its_own_writes(tmp_path, monkeypatch):
    pkg = tmp_path / "mymodels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("import json\nDEPTH = 3\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"depth": 3}))
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = CaseFiles()
    with loaded.watch():
        importlib.import_module("mymodels.layers")
        importlib.import_module("email.mime.text")          # the standard library: not a case file
        with open(config) as fh:
            json.load(fh)
        written = tmp_path / "written.onnx"
        written.write_bytes(b"onnx")
        written.read_bytes()                                 # an output read back: not an input
    with open(tmp_path / "after.txt", "w") as fh:            # outside the watch
        fh.write("x")
    (tmp_path / "after.txt").read_text()
    files = loaded.digests(tmp_path)
    assert {"mymodels/__init__.py", "mymodels/layers.py", "config.json"} <= set(files)
    assert not {"written.onnx", "after.txt"} & set(files)
    assert not any("email" in name or "site-packages" in name or "__pycache__" in name for name in files)
    assert files["config.json"] == file_digest(config)
    for name in ("mymodels.layers", "mymodels"):
        sys.modules.pop(name, None)
