"""The documentation site: `mkdocs build --strict` passes, the generated reference pages list every
matrix key and record field the code has, and every command and option the pages (and the
README) name exists in the command line parser."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

from harness.cli import build_parser

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]

# Options the pages name that belong to other tools (the command they are given to is named
# beside them in the page).
FOREIGN = {
    "--strict": "mkdocs build", "--offline": "zizmor", "--no-deps": "pip/uv", "--gpus": "docker",
    "--init": "docker", "--system-site-packages": "uv venv", "--python": "uv", "--extra-index-url": "pip",
    "--index-url": "pip", "--find-links": "pip", "--from": "uvx", "--hash": "pip (requirements files)",
    "--ignore-scripts": "npm ci", "--prefer-offline": "npm ci", "--no-venv": "nox",
    "--compile-bytecode": "uv pip install",
}


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _nox_sessions() -> set[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                if getattr(call.func if call else dec, "attr", "") == "session":
                    given = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                    names.add(given[0] if given else node.name)
    return names


def _code(text: str) -> list[str]:
    """Every inline code span and every line of every fenced block."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    rest = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.S)
    return [line for b in blocks for line in b.splitlines()] + re.findall(r"`([^`\n]+)`", rest)


COMMAND = re.compile(r"(?:torch-onnx-matrix|python -m harness|nox -s)\s+([a-z][\w-]*)(.*)")


def _commands(pages: list[Path]) -> list[tuple[str, str, str, str]]:
    """(page, launcher, subcommand, rest of the command) for every command the pages show."""
    out = []
    for page in pages:
        for code in _code(page.read_text(encoding="utf-8")):
            code = code.split("#", 1)[0]
            for m in COMMAND.finditer(code):
                launcher = m.group(0).split()[0]
                rest = re.split(r"\s(?:torch-onnx-matrix|python -m harness|nox -s)\s|[;&|]{2}|\s\|\s", m.group(2))[0]
                out.append((page.name, launcher, m.group(1), rest))
    return out


def test_docs_build_strict(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    cmd = [str(mkdocs)] if mkdocs.exists() else [sys.executable, "-m", "mkdocs"]
    assert mkdocs.exists() or shutil.which("mkdocs") or importlib.util.find_spec("mkdocs"), \
        "mkdocs is missing: install the project's test extra (pip install -e '.[test]')"
    proc = subprocess.run([*cmd, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={**__import__("os").environ,
                                                                          "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = tmp_path / "site"
    reference = (site / "matrix-file" / "index.html").read_text(encoding="utf-8")
    from harness.matrix.config import Matrix

    for key in Matrix.model_fields:
        assert f"<code>{key}</code>" in reference, key
    assert "generated: matrix-schema" not in reference
    records = (site / "records" / "index.html").read_text(encoding="utf-8")
    from harness.core.record import LATENCY_KEYS, Latency, Parity, Record

    for cls in (Record, Parity, Latency):
        stored = LATENCY_KEYS if cls is Latency else {}   # documented by the key a record stores
        for f in dataclasses.fields(cls):
            if f.name != "extra":
                assert f"<code>{stored.get(f.name, f.name)}</code>" in records, (cls.__name__, f.name)
    for page in ("robustness", "isolation", "blame", "edge-runtimes", "gate", "architecture"):
        assert (site / page / "index.html").exists(), page


def test_reference_is_complete_and_notices_an_undocumented_key(monkeypatch):
    hooks = _hooks()
    assert hooks.matrix_reference()[1] == []
    assert hooks.record_reference()[1] == []
    monkeypatch.delitem(hooks.MATRIX_KEYS["Matrix"], "jobs")
    monkeypatch.setitem(hooks.RECORD_FIELDS["Record"], "no_such_field", "x")
    assert any("Matrix.jobs" in p for p in hooks.matrix_reference()[1])
    assert any("no_such_field" in p for p in hooks.record_reference()[1])


def _command_problems(pages: list[Path]) -> tuple[int, list[str]]:
    parser = build_parser()
    subs = _subparsers(parser)
    global_options = _options(parser)
    sessions = _nox_sessions()
    commands = _commands(pages)
    problems = []
    for page, launcher, sub, rest in commands:
        if launcher == "nox":
            if sub not in sessions:
                problems.append(f"{page}: nox session {sub!r} does not exist")
            if sub not in subs:
                continue    # a session of its own (tests): its arguments are pytest's
            rest = rest.split("--", 1)[1] if re.match(r"\s*--(\s|$)", rest) else ""
        elif sub not in subs:
            problems.append(f"{page}: `{launcher} {sub}`: no such subcommand")
            continue
        known = _options(subs[sub]) | global_options
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest):
            if option not in known:
                problems.append(f"{page}: `{sub} {option}`: no such option")
    return len(commands), problems


def test_every_command_and_option_in_the_docs_exists():
    count, problems = _command_problems(PAGES)
    assert count > 30   # the pages do show commands: the scan finds them
    assert not problems, "\n".join(problems)


def test_every_option_named_anywhere_in_the_docs_exists():
    parser = build_parser()
    known = _options(parser).union(*(_options(p) for p in _subparsers(parser).values()))
    named = {(page.name, o) for page in PAGES for code in _code(page.read_text(encoding="utf-8"))
             for o in re.findall(r"(?<![\w-])--[a-z][\w-]*", code)}
    missing = sorted((page, o) for page, o in named if o not in known and o not in FOREIGN)
    assert not missing, missing


def test_the_scan_catches_a_wrong_command_or_option(tmp_path):
    """The check itself fails on a page naming an option or a subcommand the parser lacks."""
    bad = tmp_path / "bad.md"
    bad.write_text("Run `torch-onnx-matrix matrix --no-such-option --jobs 2`, `nox -s plan -- --shards 2 --nope`,\n"
                   "```\npython -m harness frobnicate\ntorch-onnx-matrix gate --from-deps origin/main\n```\n")
    count, problems = _command_problems([bad])
    assert count == 4
    assert sorted(problems) == ["bad.md: `matrix --no-such-option`: no such option",
                                "bad.md: `plan --nope`: no such option",
                                "bad.md: `python frobnicate`: no such subcommand"], problems
