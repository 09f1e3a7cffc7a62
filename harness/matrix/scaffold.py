"""``init``: a starter matrix file and a gate workflow for the repository in the current directory.

The matrix lists the repository's own cases (functions returning a model and its inputs, found
with ``ast``, never imported) through a ``cases:`` glob per file (by name where the file also has
other functions a glob would take), or, where there are none, one
example case written beside it: a case for each ``nn.Module`` subclass it can build without
arguments whose first layer says the input's shape (``Linear``, ``Conv1d/2d/3d``, ``Embedding``),
else a small MLP to replace. Its torch releases are the one the dependency files pin and the
newest one this tool was verified with. Nothing existing is overwritten.
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.matrix.config import _SKIP_DIRS, _parse_file, case_functions
from harness.matrix.deps import find_files, public, read_pins, working_tree_reader
from harness.matrix.rules import ConfigError

NEWEST_TORCH = "2.13.0"   # the newest release the default matrix verifies
TEMPLATES = Path(__file__).resolve().parent / "templates"
WORKFLOW = Path(".github") / "workflows" / "torch-onnx-gate.yml"
EXAMPLE = "onnx_cases.py"


@dataclass
class Scaffold:
    matrix: str
    workflow: str
    example: str | None = None            # the example case file's text, when one is written
    notes: list[str] = field(default_factory=list)


def _python_files(root: Path) -> list[Path]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p in _SKIP_DIRS or p.startswith(".") for p in rel.parts[:-1]):
            continue
        out.append(path)
    return out


def _mentions_torch(path: Path) -> bool:
    try:
        return "torch" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _looks_like_case(node: ast.FunctionDef, helpers: set[str]) -> bool:
    """A function that returns a tuple (model, inputs, ...) or what a helper of its file builds
    (``return _kv(3)``): what ``init`` lists as a case."""
    for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return)):
        if isinstance(ret.value, ast.Tuple) and len(ret.value.elts) >= 2:
            return True
        if isinstance(ret.value, ast.Call) and _call_name(ret.value) in helpers:
            return True
    return False


def _cases_of(root: Path, path: Path) -> list[str]:
    """``file.py:*`` when every function a glob takes there looks like a case, else the ones that
    do by name (a glob would also take ``main()``, a recorded failure on every run)."""
    tree = _parse_file(path)
    if isinstance(tree, str):
        return []
    taken = case_functions(path)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    looking = [f for f in taken if f in defs and _looks_like_case(defs[f], set(defs))]
    rel = path.relative_to(root).as_posix()
    if not looking:
        return []
    return [f"{rel}:*"] if looking == taken else [f"{rel}:{f}" for f in looking]


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _int(node: ast.AST | None) -> int | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _example_input(cls: ast.ClassDef) -> tuple[str, str] | None:
    """(inputs expression, dynamic dims) from the first layer built in ``__init__``. Dynamic dims
    get example sizes above 1: the dynamo exporter specialises a dim of size 0 or 1."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return None
    a = init.args
    if len(a.args) - len(a.defaults) > 1 or any(d is None for d in a.kw_defaults):
        return None    # needs constructor arguments this cannot guess
    for node in ast.walk(init):
        if not isinstance(node, ast.Call):
            continue
        name, first = _call_name(node), _int(node.args[0]) if node.args else None
        if first is None:
            continue
        if name == "Linear":
            return f"(torch.randn(2, {first}),)", '{0: {0: "batch"}}'
        if name == "Conv1d":
            return f"(torch.randn(2, {first}, 64),)", '{0: {0: "batch", 2: "length"}}'
        if name == "Conv2d":
            return f"(torch.randn(2, {first}, 32, 32),)", '{0: {0: "batch", 2: "height", 3: "width"}}'
        if name == "Conv3d":
            return f"(torch.randn(2, {first}, 8, 16, 16),)", '{0: {0: "batch"}}'
        if name == "Embedding":
            return f"(torch.randint(0, {first}, (2, 16)),)", '{0: {0: "batch", 1: "seq"}}'
    return None


def _modules(root: Path, files: list[Path]) -> list[tuple[str, str, str, str]]:
    """(import path, class, inputs, dims) of buildable ``nn.Module`` subclasses."""
    out = []
    for path in files:
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (SyntaxError, OSError, ValueError):
            continue
        rel = path.relative_to(root).with_suffix("")
        if rel.name == "__init__" or not all(p.isidentifier() for p in rel.parts):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and any(
                    _call_name(b) == "Module" for b in node.bases):
                if guess := _example_input(node):
                    out.append((".".join(rel.parts), node.name, *guess))
    return out


def _example_cases(modules: list[tuple[str, str, str, str]]) -> str:
    lines = ['"""Cases for the torch -> ONNX matrix (written by `torch-onnx-matrix init`).', "",
             "A case returns (model, example inputs, dynamic dims): check the inputs below are what",
             'your models take in production, and add cases for the models you ship."""',
             "import torch", ""]
    if modules:
        for module in sorted({m for m, *_ in modules}):
            names = ", ".join(sorted(c for m, c, *_ in modules if m == module))
            lines.insert(5, f"from {module} import {names}")
        lines.append("")
        for _, cls, inputs, dims in modules:
            lines += ["", f"def {cls.lower()}():",
                      f"    return {cls}().eval(), {inputs}, {dims}", ""]
    else:
        lines += ["", "def tiny_mlp():",
                  "    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))",
                  '    return model.eval(), (torch.randn(2, 16),), {0: {0: "batch"}}', ""]
    return "\n".join(lines).replace("\n\n\n\n", "\n\n\n")


def scaffold(root: Path, matrix_name: str = "matrix.yaml", tool: str = "torch-onnx-matrix") -> Scaffold:
    """What ``init`` writes for the repository at ``root`` (nothing is written here)."""
    notes: list[str] = []
    files = [p for p in _python_files(root) if _mentions_torch(p)]
    with_cases = [(p, refs) for p in files if p.name != EXAMPLE and (refs := _cases_of(root, p))]
    example = None
    if with_cases:
        cases = [ref for _, refs in with_cases for ref in refs]
        found = sum(len(case_functions(p)) if refs[0].endswith(":*") else len(refs) for p, refs in with_cases)
        notes.append(f"cases: {found} case function(s) in "
                     f"{', '.join(p.relative_to(root).as_posix() for p, _ in with_cases)}")
    else:
        modules = _modules(root, files)
        example = _example_cases(modules)
        cases = [f"{EXAMPLE}:*"]
        notes.append(f"cases: {EXAMPLE} written with " + (
            f"{len(modules)} case(s) for {', '.join(c for _, c, *_ in modules)}" if modules
            else "an example case to replace with your models"))
    pins = read_pins(find_files(root), working_tree_reader(root))
    torch = [public(pins.torch)] if pins.torch else []
    if pins.torch:
        notes.append(f"torch: {public(pins.torch)} from {pins.sources['torch']}, and {NEWEST_TORCH}")
    else:
        notes.append(f"torch: no pin found in the dependency files; {NEWEST_TORCH}")
    if NEWEST_TORCH not in torch:
        torch.append(NEWEST_TORCH)
    quoted = ", ".join(json.dumps(v) for v in torch)        # a JSON string is a YAML string
    case_list = ", ".join(json.dumps(c) for c in cases)
    matrix = f"""# The torch -> ONNX matrix of this repository (written by `torch-onnx-matrix init`).
# Every combination of the lists below is a cell: exported, checked, loaded, run at two shapes,
# compared with torch eager and timed. Reference: the documentation's "The matrix file".
torch: [{quoted}]          # the pinned release and the newest one
exporters: [torchscript, dynamo]
opsets: [17, 18]
runtimes: [ort-cpu]
cases: [{case_list}]   # relative to this file; `file.py:*` is every case function there
"""
    check_values(matrix_name, tool)
    workflow = (TEMPLATES / "gate-workflow.yml").read_text(encoding="utf-8")
    # Each value one quoted YAML scalar: it can neither end its line nor add a key.
    workflow = workflow.replace("__MATRIX__", json.dumps(matrix_name)).replace("__TOOL__", json.dumps(tool))
    return Scaffold(matrix, workflow, example, notes)


_MATRIX_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.ya?ml$")
_TOOL = re.compile(r"^[A-Za-z0-9_.@:/+=~!<>,\[\]#%-]+$")


def check_values(matrix_name: str, tool: str) -> None:
    """``--config`` and ``--tool`` become values in the workflow (a path filter, an environment
    variable pip reads): a plain file name, and a pip requirement, version or URL without spaces,
    quotes or a GitHub expression (``${{ }}`` would be evaluated by the runner)."""
    if not _MATRIX_NAME.match(matrix_name):
        raise ConfigError(f"init: --config {matrix_name!r}: expected a file name such as matrix.yaml "
                          "(letters, digits, '.', '_', '-'; ending .yaml or .yml)")
    if not _TOOL.match(tool) or "${{" in tool or tool.startswith("-"):
        raise ConfigError(f"init: --tool {tool!r}: expected what pip installs: a package, a pinned version "
                          "(torch-onnx-matrix==1.2.0) or a URL (git+https://...), without spaces or quotes")


def _target_problem(root: Path, path: Path) -> str | None:
    """Why ``init`` may not write ``path`` (None: it may): a folder on the way that is a file, a
    symbolic link (dangling or not) that leads out of the repository, nothing writable there."""
    rel = path.relative_to(root)
    for i in range(1, len(rel.parts) + 1):
        here = root.joinpath(*rel.parts[:i])
        if here.is_symlink() or here.exists():
            real = Path(os.path.realpath(here))
            if not real.is_relative_to(Path(os.path.realpath(root))):
                return f"{here.relative_to(root)} is a symbolic link to {real}, outside the repository"
            if i < len(rel.parts) and not here.is_dir():
                return f"{here.relative_to(root)} is a file; expected a folder there (or nothing)"
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        return f"{existing} is not writable"
    return None


def _write_all(root: Path, targets: list[tuple[Path, str]]) -> None:
    """Write every target or none: each to a temporary file beside it, then all moved into place;
    on a failure the temporary files and the folders made for them are removed."""
    made: list[Path] = []
    written: list[tuple[Path, Path]] = []
    try:
        for path, text in targets:
            missing = [p for p in reversed(path.parents) if p.is_relative_to(root) and not p.exists()]
            for folder in missing:
                folder.mkdir()
                made.append(folder)
            tmp = path.with_name(f".{path.name}.init-tmp")
            tmp.write_text(text, encoding="utf-8")
            written.append((tmp, path))
        for tmp, path in written:
            os.replace(tmp, path)
    except OSError as exc:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise ConfigError(f"init: cannot write {exc.filename or root}: {exc.strerror or exc}; nothing was "
                          "written") from None


def _ignores_reports(root: Path) -> bool:
    ignore = root / ".gitignore"
    try:
        text = ignore.read_bytes().decode("utf-8", errors="replace") if ignore.is_file() else ""
    except OSError:
        return False
    return any(line.strip().strip("/") == "reports" for line in text.splitlines())


def write_scaffold(root: Path, matrix_name: str = "matrix.yaml", tool: str = "torch-onnx-matrix",
                   force: bool = False) -> list[str]:
    """Write the matrix file, the workflow and (when needed) the example cases, all of them or
    none (exit 2 naming why, before anything is written); the lines to print."""
    root = Path(root)
    plan = scaffold(root, matrix_name, tool)
    targets = [(root / matrix_name, plan.matrix), (root / WORKFLOW, plan.workflow)]
    if plan.example is not None:
        targets.append((root / EXAMPLE, plan.example))
    problems = [why for p, _ in targets if (why := _target_problem(root, p))]
    if problems:
        raise ConfigError(f"init: {'; '.join(dict.fromkeys(problems))}; nothing was written")
    existing = [str(p.relative_to(root)) for p, _ in targets if p.exists()]
    if existing and not force:
        raise ConfigError(f"init: {', '.join(existing)} already exist(s); expected a repository "
                          "without them (--force overwrites)")
    if not _ignores_reports(root):
        plan.notes.append("reports/ will hold the results store: add it to .gitignore")
    _write_all(root, targets)
    return [f"wrote {p.relative_to(root)}" for p, _ in targets] + plan.notes
