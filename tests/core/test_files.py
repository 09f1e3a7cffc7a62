"""Case files by content (harness.core.files) and what the worker counts as loaded by a case
(harness.worker.loaded): modules and opened files outside the environment, never the files the
case wrote itself."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

from harness.core.files import (
    case_file_key,
    changed_case_files,
    differing_case_files,
    expand_declared,
    file_digest,
)
from harness.worker.loaded import CaseFiles


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
    # The user's files, written by another process (this one's own writes are outputs).
    config = tmp_path / "config.json"
    subprocess.run([sys.executable, "-c", "import json, os, sys; p = sys.argv[1]; os.mkdir(p + '/mymodels'); "
                    "open(p + '/mymodels/__init__.py', 'w').close(); "
                    "open(p + '/mymodels/layers.py', 'w').write('import json\\nDEPTH = 3\\n'); "
                    "open(p + '/config.json', 'w').write(json.dumps({'depth': 3}))", str(tmp_path)], check=True)
    generated = tmp_path.parent / f"{tmp_path.name}_generated"     # a library's module in /tmp
    subprocess.run([sys.executable, "-c", f"import os; os.mkdir({str(generated)!r}); "
                    f"open({str(generated / 'gen_mod_x.py')!r}, 'w').write('X = 1')"], check=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(generated))
    loaded = CaseFiles()
    with loaded.watch():
        importlib.import_module("gen_mod_x")
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
    assert not any("gen_mod_x" in name for name in files)
    assert not any("email" in name or "site-packages" in name or "__pycache__" in name for name in files)
    assert files["config.json"] == file_digest(config)
    for name in ("mymodels.layers", "mymodels", "gen_mod_x"):
        sys.modules.pop(name, None)


def test_a_module_imported_again_under_its_name_is_seen_with_its_new_file(tmp_path, monkeypatch):
    """Module files are remembered by name and module: a name that now holds another module
    (a case that reloads or replaces its own) is asked again, and a module gone is not listed."""
    # Written by another process: this one's own writes are outputs, never case files.
    subprocess.run([sys.executable, "-c", "import os, sys\nfor f in ('one', 'two'):\n"
                    "    os.mkdir(os.path.join(sys.argv[1], f))\n"
                    "    open(os.path.join(sys.argv[1], f, 'swapped_case_mod.py'), 'w').write(f'WHERE = {f!r}')",
                    str(tmp_path)], check=True)
    loaded = CaseFiles()
    monkeypatch.syspath_prepend(str(tmp_path / "one"))
    importlib.import_module("swapped_case_mod")
    assert "one/swapped_case_mod.py" in loaded.digests(tmp_path)
    sys.modules.pop("swapped_case_mod")
    assert not any("swapped_case_mod" in name for name in loaded.digests(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path / "two"))
    importlib.import_module("swapped_case_mod")
    files = loaded.digests(tmp_path)
    assert "two/swapped_case_mod.py" in files and "one/swapped_case_mod.py" not in files
    sys.modules.pop("swapped_case_mod")
