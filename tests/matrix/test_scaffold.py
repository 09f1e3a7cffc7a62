"""`init` and `cases:` globs: a repository's own case functions are found with ast (never
imported), a glob expands to them in sorted order, one matching nothing is one line naming the
key; without case functions, buildable modules become example cases; the torch pin comes from
the dependency files."""
from __future__ import annotations

import textwrap

import pytest
import yaml

from harness.matrix.config import case_functions, load_matrix
from harness.matrix.rules import ConfigError
from harness.matrix.scaffold import NEWEST_TORCH, scaffold, write_scaffold

CASES = textwrap.dedent('''
    import torch


    def encoder():
        return torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),)


    def decoder(seq=8):
        model = torch.nn.Linear(seq, 2)
        return model, (torch.randn(2, seq),), {0: {0: "batch"}}


    def helper(x):            # needs an argument: not a case
        return x, x


    def _private():
        return 1, 2


    def loader():              # returns no tuple: a glob takes it (a recorded failure); init does not
        return torch.nn.Linear(1, 1)
''')


def test_case_functions_are_read_not_imported(tmp_path):
    path = tmp_path / "cases.py"
    path.write_text(CASES + "\nraise SystemExit('imported')\n")
    assert case_functions(path) == ["encoder", "decoder", "loader"]


def test_a_glob_expands_to_case_functions_relative_to_the_matrix_file(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "b.py").write_text(CASES)
    (tmp_path / "models" / "a.py").write_text("def net():\n    return 1, 2\n")
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "c.py").write_text(CASES)
    m = tmp_path / "matrix.yaml"
    m.write_text('torch: ["2.13.0"]\nexporters: [dynamo]\nopsets: [18]\n'
                 'cases: ["models/*.py:*", "**/b.py:enc*", mha]\n')
    matrix = load_matrix(m)
    assert [c.label for c in matrix.cases] == ["net", "encoder", "decoder", "loader", "mha"]
    assert matrix.cases[0].target == f"{tmp_path / 'models' / 'a.py'}:net"


def test_a_glob_matching_nothing_is_one_line_naming_the_key(tmp_path):
    m = tmp_path / "matrix.yaml"
    m.write_text('torch: ["2.13.0"]\nexporters: [dynamo]\nopsets: [18]\ncases: [mha, "src/*.py:*"]\n')
    with pytest.raises(ConfigError, match=r"key 'cases\[1\]': expected 'src/\*.py:\*' to match case functions"):
        load_matrix(m)


def test_init_lists_the_repository_s_own_cases_with_a_glob(tmp_path):
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "cases.py").write_text(CASES)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch==2.9.1"]\n')
    plan = scaffold(tmp_path)
    data = yaml.safe_load(plan.matrix)
    # loader() returns no tuple: a glob would take it, so init names the cases one by one.
    assert data["cases"] == ["onnx/cases.py:encoder", "onnx/cases.py:decoder"] and plan.example is None
    assert data["torch"] == ["2.9.1", NEWEST_TORCH]
    lines = write_scaffold(tmp_path)
    assert "wrote matrix.yaml" in lines and (tmp_path / ".github" / "workflows" / "torch-onnx-gate.yml").exists()
    assert [c.label for c in load_matrix(tmp_path / "matrix.yaml").cases] == ["encoder", "decoder"]
    with pytest.raises(ConfigError, match="already exist"):
        write_scaffold(tmp_path)


def test_init_writes_example_cases_for_buildable_modules(tmp_path):
    (tmp_path / "models.py").write_text(textwrap.dedent('''
        import torch.nn as nn


        class Classifier(nn.Module):
            def __init__(self, classes=10):
                super().__init__()
                self.conv = nn.Conv2d(3, 16, 3)

            def forward(self, x):
                return self.conv(x)


        class Tagger(nn.Module):
            def __init__(self, vocab):           # needs an argument: left out
                super().__init__()
                self.emb = nn.Embedding(vocab, 8)
    '''))
    plan = scaffold(tmp_path)
    assert "from models import Classifier" in plan.example and "Tagger" not in plan.example
    assert "Classifier().eval(), (torch.randn(2, 3, 32, 32),)" in plan.example
    assert yaml.safe_load(plan.matrix)["torch"] == [NEWEST_TORCH]   # no pin found
    write_scaffold(tmp_path)
    assert [c.label for c in load_matrix(tmp_path / "matrix.yaml").cases] == ["classifier"]


def test_init_without_models_writes_one_example_case(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch==2.6.0\n")
    write_scaffold(tmp_path)
    assert [c.label for c in load_matrix(tmp_path / "matrix.yaml").cases] == ["tiny_mlp"]
    assert yaml.safe_load((tmp_path / "matrix.yaml").read_text())["torch"] == ["2.6.0", NEWEST_TORCH]


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_init_never_writes_through_a_symlink_out_of_the_repository(tmp_path):
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (repo / "matrix.yaml").symlink_to(outside / "planted.yaml")          # dangling, pointing out
    with pytest.raises(ConfigError, match=r"matrix.yaml is a symbolic link to .*outside.*planted.yaml, outside the repository"):
        write_scaffold(repo, force=True)
    (repo / "matrix.yaml").unlink()
    (repo / ".github").symlink_to(outside)                                # a folder on the way
    with pytest.raises(ConfigError, match=r"\.github is a symbolic link to .*, outside the repository"):
        write_scaffold(repo)
    assert not list(outside.iterdir()) and _files(repo) == [".github"]


def test_init_fails_cleanly_where_it_cannot_write(tmp_path):
    import os

    (tmp_path / ".github").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"^init: \.github is a file; expected a folder there \(or nothing\); nothing was written"):
        write_scaffold(tmp_path)
    assert _files(tmp_path) == [".github"]
    (tmp_path / ".github").unlink()
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="is not writable; nothing was written"):
            write_scaffold(tmp_path)
    finally:
        tmp_path.chmod(0o755)
    assert _files(tmp_path) == []


def test_init_writes_all_or_nothing_when_a_write_fails(tmp_path, monkeypatch):
    """A failure after the checks (a full disk, a race): the files already written are removed."""
    from pathlib import Path as _Path

    real = _Path.write_text
    calls = []

    def failing(self, *args, **kw):
        calls.append(self.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(self))
        return real(self, *args, **kw)
    monkeypatch.setattr(_Path, "write_text", failing)
    with pytest.raises(ConfigError, match="No space left on device; nothing was written"):
        write_scaffold(tmp_path)
    monkeypatch.undo()
    assert _files(tmp_path) == [] and len(calls) == 2


def test_init_reads_a_gitignore_that_is_not_utf8(tmp_path):
    (tmp_path / ".gitignore").write_bytes(b"# caf\xe9\nreports/\n")
    lines = write_scaffold(tmp_path)
    assert "wrote matrix.yaml" in lines and not any(".gitignore" in line for line in lines)


@pytest.mark.parametrize("option, value", [
    ("tool", 'x"\n  INJECTED: "1'),
    ("tool", "${{ secrets.GITHUB_TOKEN }}"),
    ("tool", "pkg --index-url https://evil"),
    ("config", 'm.yaml"\non: push\n#'),
    ("config", "*.yaml"),
])
def test_init_values_cannot_inject_keys_into_the_workflow(tmp_path, option, value):
    kwargs = {"tool": value} if option == "tool" else {"matrix_name": value}
    with pytest.raises(ConfigError, match=f"init: --{option} "):
        write_scaffold(tmp_path, **kwargs)
    assert _files(tmp_path) == []


def test_init_values_land_as_single_quoted_scalars(tmp_path):
    plan = scaffold(tmp_path, "gate.yml", "git+https://github.com/o/r@v1.0#egg=torch-onnx-matrix")
    data = yaml.safe_load(plan.workflow)
    assert data["env"]["MATRIX"] == "gate.yml" and data["env"]["TOOL"] == "git+https://github.com/o/r@v1.0#egg=torch-onnx-matrix"
    assert "gate.yml" in data[True]["pull_request"]["paths"]


def test_init_refusals_are_exit_2(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    (tmp_path / ".github").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 2
    assert capsys.readouterr().err.startswith("error: init: .github is a file")
    assert main(["init", "--tool", "a b"]) == 2 and _files(tmp_path) == [".github"]
