"""`gate --from-deps` reads dependency files as the user meant them or refuses them: markers
give the pin of the platform the gate runs on, one file pinning torch twice, Pipfile.lock's
`default` against `develop`, a move to a wheel URL, malformed locks and non-UTF-8 bytes are exit 2
naming the file and line; never "no torch bump" when there is one. No torch needed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_deps import _cli, _git

from harness.gate.deps import read_sides
from harness.matrix.deps import parse_lock, parse_pipfile_lock, parse_pyproject, parse_requirements
from harness.matrix.rules import ConfigError

HERE = f'sys_platform == "{sys.platform}"'
ELSEWHERE = f'sys_platform != "{sys.platform}"'
WHEEL = "https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl"


def _repo(tmp_path: Path, base: dict[str, str | bytes], head: dict[str, str | bytes]) -> Path:
    """A repository whose main holds ``base`` and whose working tree holds ``head``."""
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)

    def write(files: dict[str, str | bytes]) -> None:
        for name, text in files.items():
            path = repo / name
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
    write(base)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    write(head)
    return repo


def _sides(tmp_path: Path, base: dict, head: dict) -> tuple[str, str]:
    sides = read_sides("main", _repo(tmp_path, base, head))
    return sides.baseline.torch, sides.candidate.torch


def test_markers_give_this_platform_s_pin_in_requirements(tmp_path):
    """The issue's case: the linux pin bumped beside an unchanged pin for another platform, which
    used to win as the file's last torch line (2.2.2 -> 2.2.2, "no torch bump")."""
    base = {"requirements.txt": f"torch==2.6.0 ; {HERE}\ntorch==2.2.2 ; {ELSEWHERE}\n"}
    head = {"requirements.txt": f"torch==2.13.0 ; {HERE}\ntorch==2.2.2 ; {ELSEWHERE}\n"}
    assert _sides(tmp_path, base, head) == ("2.6.0", "2.13.0")


def test_markers_give_this_platform_s_pin_in_pyproject(tmp_path):
    def pyproject(version: str) -> str:
        return (f'[project]\nname = "app"\nversion = "1"\ndependencies = [\n  \'torch=={version} ; {HERE}\',\n'
                f'  \'torch==2.2.2 ; {ELSEWHERE}\',\n]\n')
    assert _sides(tmp_path, {"pyproject.toml": pyproject("2.6.0")}, {"pyproject.toml": pyproject("2.13.0")}) \
        == ("2.6.0", "2.13.0")


def test_a_pin_only_for_another_platform_is_named_when_none_is_left(tmp_path):
    repo = _repo(tmp_path, {"requirements.txt": "torch==2.6.0\n"},
                 {"requirements.txt": f"numpy==2.2.6\ntorch==2.13.0 ; {ELSEWHERE}\n"})
    with pytest.raises(ConfigError, match=r"pins no torch release .*other platforms than this one .*"
                                          r"requirements.txt:2 \(sys_platform !="):
        read_sides("main", repo)


def test_one_file_pinning_torch_twice_names_both_lines():
    text = "numpy==2.2.6\ntorch==2.6.0\n# the bump\ntorch==2.13.0\n"
    with pytest.raises(ConfigError, match=r"^r.txt:4: pins torch 2.13.0, but r.txt:2 pins torch 2.6.0, both for this platform"):
        parse_requirements(text, "r.txt")
    assert parse_requirements("torch==2.6.0\ntorch==2.6.0+cpu\n", "r.txt") == {"torch": "2.6.0"}
    pyproject = '[project]\nname = "a"\nversion = "1"\ndependencies = ["torch==2.6.0"]\n' \
                '[dependency-groups]\ndev = ["torch==2.13.0"]\n'
    with pytest.raises(ConfigError, match=r"pyproject.toml:6: pins torch 2.13.0, but pyproject.toml:4 pins"):
        parse_pyproject(pyproject, "pyproject.toml")


def _pipfile_lock(default: str | None, develop: str | None, markers: str | None = None) -> str:
    def section(version: str | None) -> dict:
        if version is None:
            return {}
        return {"torch": {"version": f"=={version}", **({"markers": markers} if markers else {})}}
    return json.dumps({"_meta": {}, "default": section(default), "develop": section(develop)}, indent=4)


def test_pipfile_lock_default_against_develop():
    with pytest.raises(ConfigError, match=r"Pipfile.lock:\d+ \(develop\): locks torch 2.13.0, but "
                                          r"Pipfile.lock:\d+ \(default\) locks torch 2.6.0"):
        parse_pipfile_lock(_pipfile_lock("2.6.0", "2.13.0"), "Pipfile.lock")
    assert parse_pipfile_lock(_pipfile_lock(None, "2.13.0"), "Pipfile.lock") == {"torch": "2.13.0"}
    assert parse_pipfile_lock(_pipfile_lock("2.6.0", "2.6.0"), "Pipfile.lock") == {"torch": "2.6.0"}
    assert parse_pipfile_lock(_pipfile_lock("2.6.0", None, ELSEWHERE.replace('"', "'")), "Pipfile.lock") == {}


def test_a_bump_only_in_develop_is_a_bump(tmp_path):
    assert _sides(tmp_path, {"Pipfile.lock": _pipfile_lock(None, "2.6.0")},
                  {"Pipfile.lock": _pipfile_lock(None, "2.13.0")}) == ("2.6.0", "2.13.0")


def test_a_move_to_a_wheel_url_is_read_from_its_file_name(tmp_path):
    base = {"requirements.txt": "torch==2.6.0\n"}
    head = {"requirements.txt": f"torch @ {WHEEL}\n"}
    assert _sides(tmp_path, base, head) == ("2.6.0", "2.13.0+cpu")
    bare = {"requirements.txt": f"{WHEEL}\n"}
    assert _sides(tmp_path / "bare", base, bare) == ("2.6.0", "2.13.0+cpu")
    assert parse_requirements(f"{WHEEL} ; {ELSEWHERE}\n{WHEEL.replace('2.13.0', '2.9.1')} ; {HERE}\n", "r.txt") \
        == {"torch": "2.9.1+cpu"}


def test_a_wheel_url_against_a_pin_elsewhere_names_both_lines(tmp_path):
    """The issue's case: the pull request moves torch to a wheel URL while pyproject.toml keeps
    2.6.0; that used to be "no torch bump" (the URL was skipped)."""
    pyproject = '[project]\nname = "a"\nversion = "1"\ndependencies = ["torch==2.6.0"]\n'
    repo = _repo(tmp_path, {"requirements.txt": "torch==2.6.0\n", "pyproject.toml": pyproject},
                 {"requirements.txt": f"numpy==2.2.6\ntorch @ {WHEEL}\n"})
    with pytest.raises(ConfigError, match=r"pyproject.toml:4: pins torch==2.6.0, but requirements.txt:2 pins torch==2.13.0\+cpu"):
        read_sides("main", repo)


def test_a_torch_url_without_a_release_is_refused():
    with pytest.raises(ConfigError, match=r"r.txt:1: torch @ git\+https://github.com/pytorch/pytorch: no release"):
        parse_requirements("torch @ git+https://github.com/pytorch/pytorch\n", "r.txt")
    assert parse_requirements("mylib @ git+https://example.com/mylib\ntorch==2.6.0\n", "r.txt") == {"torch": "2.6.0"}


def test_poetry_constraints_per_platform():
    text = ('[tool.poetry.dependencies]\npython = "^3.11"\ntorch = [\n'
            f'  {{version = "2.13.0", markers = \'{HERE}\'}},\n'
            f'  {{version = "2.2.2", markers = \'{ELSEWHERE}\'}},\n]\n')
    assert parse_pyproject(text, "pyproject.toml") == {"torch": "2.13.0"}


@pytest.mark.parametrize("text, says", [
    ('version = 1\npackage = "torch"\n', r"uv.lock: key 'package': expected a list \(got str\)"),
    ('version = 1\npackage = [1, 2]\n', r"uv.lock: key 'package\[0\]': expected a \[\[package\]\] table"),
    ('[[package]]\nname = "torch"\nversion = 2\n[[package\n', r"uv.lock: not valid TOML"),
])
def test_malformed_locks_are_named(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_lock(text, "uv.lock")


@pytest.mark.parametrize("text, says", [
    ('[project]\nname = "a"\ndependencies = "torch==2.6.0"\n', r"key 'project.dependencies': expected a list"),
    ('project = "x"\n', r"key 'project': expected a table"),
    ('[project]\ndependencies = [1]\n', r"dependency 1: expected a requirement"),
    ('[tool]\npoetry = 3\n', r"key 'tool.poetry': expected a table"),
])
def test_malformed_pyproject_is_named(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_pyproject(text, "pyproject.toml")


@pytest.mark.parametrize("files, says", [
    ({"uv.lock": 'version = 1\npackage = "torch"\n'}, "uv.lock: key 'package': expected a list"),
    ({"requirements.txt": "numpy==2.2.6\n# caf\xe9\ntorch==2.13.0\n".encode("latin-1")},
     r"requirements.txt:2: not UTF-8 \(byte 0xe9\)"),
    ({"Pipfile.lock": '{"default": [}'}, r"Pipfile.lock:1: not valid JSON"),
])
def test_unreadable_dependency_files_exit_2_naming_file_and_line(tmp_path, files, says):
    """Used to be "unexpected AttributeError / UnicodeDecodeError" (exit 3)."""
    import re

    repo = _repo(tmp_path, {"requirements.txt": "torch==2.6.0\n"}, files)
    (repo / "matrix.yaml").write_text('torch: ["2.6.0"]\nexporters: [dynamo]\nopsets: [18]\ncases: [mha]\n')
    proc = _cli(repo, "gate", "--from-deps", "main")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and re.search(says, proc.stderr), proc.stderr


def test_latin_1_bytes_at_the_base_ref_are_named_too(tmp_path):
    repo = _repo(tmp_path, {"requirements.txt": "torch==2.6.0  # caf\xe9\n".encode("latin-1")},
                 {"requirements.txt": "torch==2.13.0\n"})
    with pytest.raises(ConfigError, match=r"main:requirements.txt:1: not UTF-8"):
        read_sides("main", repo)
