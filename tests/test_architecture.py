"""The shape of harness/: packages follow the data flow and no import runs back up it.

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
    {"matrix"},
    {"envs"},
    {"store"},
    {"run"},
    {"report"},
    {"workflow"},
    {"gate"},
    {"pipeline"},
    {"checks"},
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


def test_worker_side_modules_import_no_runner_side_dependency():
    """The worker runs inside every environment, where only torch, onnx, numpy and the runtime
    packages are installed: its modules import nothing of pydantic, pandas, rich or yaml."""
    worker_side = [HARNESS / "core", HARNESS / "runtimes", HARNESS / "probes"] + [
        HARNESS / "run" / f"{m}.py" for m in ("worker", "stages", "cases", "export", "parity", "latency", "bundle", "blame", "repro", "divergence",
                                              "dims", "reduce", "inputs", "logcap", "ab_timer", "runtime_probe",
                                              "machine_load", "noise", "export_log", "second_shape")
    ] + [HARNESS / "checks" / "bench_latency.py"]   # the bench's measurements inside an environment
    banned = re.compile(r"^(pydantic|pandas|rich|yaml|jinja2|tabulate|matplotlib|docker|filelock|psutil|scipy)\b")
    offenders = []
    for item in worker_side:
        for path in ([item] if item.is_file() else item.rglob("*.py")):
            offenders += [f"{path.relative_to(HARNESS)}: {t}" for t in _imports(path) if banned.match(t)]
            offenders += [f"{path.relative_to(HARNESS)}: {t}" for t in _imports(path)
                          if (p := _package(t)) and p in RANK and RANK[p] > RANK["run"]]
    assert not offenders, offenders


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


# Worker-side modules of run/ (and the runtime-only environment's): they run where torch, onnx
# and the runtimes are. Every other module of harness/ but probes/ and runtimes/ (imported by
# workers; the runner reads only their registries) runs in the tool's own environment.
WORKER_RUN = {"worker", "fresh", "loaded", "stages", "cases", "inputs", "export", "export_optimum", "dims",
              "parity", "latency", "machine_load", "bundle", "blame", "divergence", "repro", "determinism",
              "runtime_probe", "reference", "reduce", "logcap", "export_log", "noise", "second_shape"}
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
        if rel.parts[0] in ("probes", "runtimes") or (rel.parts[0] == "run" and path.stem in WORKER_RUN) \
                or rel.as_posix() in ("checks/bench_latency.py", "envs/existing_probe.py"):
            continue
        offenders += [f"{rel}: {t}" for t in _imports(path) if t.split(".")[0] not in allowed]
    assert not offenders, offenders
