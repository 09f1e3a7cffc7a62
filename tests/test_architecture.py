"""The shape of harness/: packages follow the data flow and no import runs back up it, and the
folder says which process runs a module (``harness/worker/``: inside an environment; everything
else but ``probes/`` and ``runtimes/``, which workers import: the runner, in the tool's own
environment). Both sides meet only in ``harness/core/wire.py`` (and ``core/events.py``).

Every import counts, also those inside functions and under TYPE_CHECKING: a lazy import against
the flow is still a dependency against it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import ROOT

HARNESS = ROOT / "harness"
# Layers in the order data flows; a module may import from its own layer and those before it.
LAYERS = [
    {"core"},
    {"probes", "runtimes", "console"},
    {"worker"},
    {"matrix"},
    {"envs"},
    {"store"},
    {"run"},
    {"report"},
    {"run_workflow"},
    {"gate"},
    {"matrix_run"},
    {"bench", "gpu_check"},
    {"cli", "__main__"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "harness" else None


def _imports(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).with_suffix("")
    here = list(rel.parts[:-1]) if path.name != "__init__.py" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                out.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                out.append(node.module)
                out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_every_package_has_a_layer():
    top = {p.stem if p.is_file() else p.name for p in HARNESS.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert top <= set(RANK), f"packages without a layer: {sorted(top - set(RANK))}"


def test_no_import_runs_against_the_flow():
    against = []
    for path in HARNESS.rglob("*.py"):
        rel = path.relative_to(HARNESS)
        mine = rel.parts[0].removesuffix(".py")
        if mine == "__init__":
            continue
        for target in _imports(path):
            theirs = _package(target)
            if theirs and theirs in RANK and RANK[theirs] > RANK[mine]:
                against.append(f"{rel} imports {target}")
    assert not against, "\n".join(against)


# What runs inside an environment: the worker's folder, and what workers import of the rest.
WORKER_SIDE = ("worker", "core", "runtimes", "probes")
# The bench (``nox -s bench``) drives worker code in its own process on purpose: it measures it.
RUNNER_MAY_IMPORT_WORKER = {"bench/suite.py"}


def _side(rel: Path) -> str:
    return "worker" if rel.parts[0] in WORKER_SIDE else "runner"


def test_worker_side_modules_import_no_runner_side_dependency():
    """The worker runs inside every environment, where only torch, onnx, numpy and the runtime
    packages are installed: its modules import nothing of pydantic, pandas, rich or yaml, and no
    runner module."""
    banned = re.compile(r"^(pydantic|pandas|rich|yaml|jinja2|tabulate|matplotlib|docker|filelock|psutil|scipy)\b")
    offenders = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS)
        if _side(rel) != "worker":
            continue
        offenders += [f"{rel}: {t}" for t in _imports(path) if banned.match(t)]
        offenders += [f"{rel}: {t}" for t in _imports(path) if (p := _package(t)) and p not in WORKER_SIDE]
    assert not offenders, offenders


def test_runner_side_modules_import_no_worker_code():
    """A runner module that imports worker code drags torch-side imports into the runner (the
    supervisor once imported a constant from the worker); the wire is ``core/wire.py``."""
    offenders = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS)
        if _side(rel) == "runner" and rel.as_posix() not in RUNNER_MAY_IMPORT_WORKER:
            offenders += [f"{rel}: {t}" for t in _imports(path) if _package(t) == "worker"]
    assert not offenders, offenders


def test_module_paths_are_spelled_only_in_the_wire():
    """A module path written as a string (``python -m harness.worker``) is an import no check
    sees: each is a constant of ``core/wire.py`` (or of the registry that names its own modules)."""
    spelled = re.compile(r"^harness(\.[a-z_]+)+$")
    started = re.compile(r"-m harness(\.[a-z_]+)+(\s|$)")   # a command line an f-string builds
    allowed = {"core/wire.py", "probes/zoo/__init__.py"}
    found = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS)
        if rel.as_posix() in allowed:
            continue
        tree = ast.parse(path.read_text())
        built = {id(v) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for v in f.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and not _is_template_package(node, path) \
                    and (spelled.match(node.value) or (id(node) in built and started.search(node.value))):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, found


def _is_template_package(node: ast.Constant, path: Path) -> bool:
    """Jinja2's template folders are packages it loads, not processes."""
    return "PackageLoader(" in path.read_text().splitlines()[node.lineno - 1]


def test_status_names_are_spelled_only_in_core():
    """Status values appear as string literals only where Status is defined."""
    names = {"pass", "fail", "xfail", "xpass", "skip", "crash", "timeout"}
    found = []
    for path in HARNESS.rglob("*.py"):
        if path.relative_to(HARNESS).parts[0] == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(HARNESS)}:{node.lineno} {node.value!r}")
    assert not found, found


# Import names of pyproject.toml's distributions where they differ, and what jinja2 brings as part
# of its own API (markupsafe.Markup).
IMPORT_NAMES = {"pyyaml": "yaml"}
ALSO_DECLARED = {"markupsafe"}


def _declared_imports() -> set[str]:
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {Requirement(d).name.lower() for d in deps}
    return {IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names} | ALSO_DECLARED | {"harness"}


def test_runner_side_modules_import_only_what_the_tool_declares():
    """The runner runs in the environment `pip install torch-onnx-matrix` (or `nox -s matrix`)
    makes: a lazy `import onnx` in a runner module works in the test runner's interpreter and
    fails for every user (the runtime floors' file facts once did)."""
    import sys

    allowed = _declared_imports() | set(sys.stdlib_module_names)
    offenders = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS)
        if _side(rel) == "worker" and rel.parts[0] != "core":
            continue
        offenders += [f"{rel}: {t}" for t in _imports(path) if t.split(".")[0] not in allowed]
    assert not offenders, offenders


def test_the_existing_environment_reader_answers_as_the_runner_reads():
    """``worker/existing_facts.py`` runs as ``python -I -c <text>`` in a foreign interpreter and
    imports nothing of the harness: its answer prefix is spelled there too, and must be the wire's."""
    from harness.core.wire import EXISTING_FACTS_FILE, EXISTING_FACTS_PREFIX
    from harness.envs.existing import PROBE_FILE

    assert PROBE_FILE == HARNESS / EXISTING_FACTS_FILE and PROBE_FILE.exists()
    assert f"PREFIX = {EXISTING_FACTS_PREFIX!r}" in PROBE_FILE.read_text().replace('"', "'")


def test_every_module_a_result_depends_on_is_in_the_cache_key():
    """The cell cache keys on a hash of the result code (``harness.store.provenance.RESULT_CODE``):
    a worker module left out of it would let a cached verdict outlive the code that made it (the
    worker's move to its own folder once did)."""
    from harness.store.provenance import RESULT_CODE

    hashed = {p for pattern in RESULT_CODE for p in HARNESS.glob(pattern)}
    for folder in ("worker", "run", "runtimes", "core"):
        missing = [str(p.relative_to(HARNESS)) for p in (HARNESS / folder).rglob("*.py") if p not in hashed]
        assert not missing, missing


def _called(node: ast.AST) -> str | None:
    """The name a call calls: ``f(...)`` and ``x.y.f(...)`` both give ``f``."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


# The one module that makes ONNX Runtime sessions (the adapters' loader), and the bench's bare
# ONNX Runtime loop: it times ONNX Runtime without the harness, what the adapter is measured against.
SESSION_LOADER = "runtimes/ort_session.py"
BARE_ONNX_RUNTIME = {"worker/bench_latency.py"}


def test_onnx_runtime_sessions_are_made_only_by_the_adapters_loader():
    """A session made past the adapters (blame's "optimisations off" rungs, divergence and
    reduction once made their own) is a second code path whose options drift from the one a
    cell runs: every other module asks an adapter, with a ``LoadOptions`` where it differs."""
    found, made_here = [], 0
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).as_posix()
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if _called(n) in {"InferenceSession", "SessionOptions"}]
        if rel == SESSION_LOADER:
            made_here = len(calls)
        elif rel not in BARE_ONNX_RUNTIME:
            found += [f"{rel}:{n.lineno}" for n in calls]
    assert made_here, f"{SESSION_LOADER} makes no session: the check below looks at the wrong module"
    assert not found, found


def test_adapters_are_activated_only_through_their_context_manager():
    """``activate()`` by hand needs a ``deactivate()`` on every path (the runtime-release check once
    left one active per file); ``with adapter:`` or ``ActiveAdapters.enter_context`` cannot forget."""
    hand = {"activate", "deactivate", "__enter__", "__exit__"}   # an adapter's ``*_impl`` calls its parent's
    found = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).as_posix()
        if rel == "runtimes/base.py":   # where the context manager is defined
            continue
        found += [f"{rel}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text())) if _called(n) in hand]
    assert not found, found
