"""Provenance: which case sources and harness version produced a run, found without importing."""
from __future__ import annotations

from pathlib import Path

from harness import __version__
from harness.matrix.config import Matrix
from harness.store.provenance import case_source, fingerprint, same_code


def _matrix(tmp_path: Path, body: str) -> Matrix:
    (tmp_path / "cases.py").write_text(body)
    return Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18],
                                  "cases": ["mha", f"{tmp_path}/cases.py:mine"]})


def test_case_source_finds_files_modules_and_probes(tmp_path):
    (tmp_path / "c.py").write_text("def f(): pass\n")
    assert case_source("c.py:f", tmp_path) == tmp_path / "c.py"
    assert case_source("mha", tmp_path).name == "attention.py"
    assert case_source("json:loads", tmp_path).name == "__init__.py"
    assert case_source("missing.py:f", tmp_path) is None
    assert case_source("not a reference", tmp_path) is None


def test_fingerprint_changes_with_the_case_source_only(tmp_path):
    first = fingerprint(_matrix(tmp_path, "def mine(): return 1\n"), tmp_path / "m.yaml")
    assert first["harness"] == __version__ and set(first["cases"]) == {"mha", "mine"}
    second = fingerprint(_matrix(tmp_path, "def mine(): return 2\n"), tmp_path / "m.yaml")
    assert first["cases"]["mha"] == second["cases"]["mha"]
    assert same_code(first, second, "mha") is True
    assert same_code(first, second, "mine") is False
    assert same_code(first, None, "mine") is None
    assert same_code(first, {**second, "harness": "0.0.1"}, "mha") is False
