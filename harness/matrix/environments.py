"""Which environment hosts a cell: companion pins per torch release and the ``EnvSpec`` of each
(torch, runtime family). Planning only: nothing here installs anything."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from harness.core.env import EnvSpec, ExistingEnv
from harness.runtimes import runtime_info

if TYPE_CHECKING:
    from harness.matrix.config import Matrix, RuntimeSpec, TorchSpec


def companion_pins(torch_version: str) -> dict[str, str]:
    """Default numpy / onnx / onnxscript / protobuf pins contemporary with a torch release.

    torch <= 2.3 was built against numpy 1.x. The dynamo exporter translates through onnxscript's
    torchlib, which moves with torch: a much newer onnxscript breaks an older torch (measured:
    torch 2.6 + onnxscript 0.7 fails to translate BatchNorm), and onnxscript < 0.3 writes bools
    into int attributes, which protobuf >= 6 rejects. Each row below was run on the probes.
    """
    v = Version(torch_version)
    if v < Version("2.4"):
        return {"numpy": "1.26.4", "onnx": "1.16.2", "onnxscript": "0.1.0", "protobuf": "4.25.8"}
    if v < Version("2.8"):
        return {"numpy": "2.2.6", "onnx": "1.17.0", "onnxscript": "0.2.7", "protobuf": "5.29.5"}
    if v < Version("2.9"):
        # torch 2.8 imports onnxscript._framework_apis.torch_2_8, first shipped in onnxscript 0.3.2
        # (with 0.2.7 every dynamo export fails: ModuleNotFoundError, found by bisecting).
        return {"numpy": "2.2.6", "onnx": "1.17.0", "onnxscript": "0.3.2", "protobuf": "5.29.5"}
    return {"numpy": "2.4.6", "onnx": "1.23.2", "onnxscript": "0.7.2"}


def env_spec_for(torch_spec: "TorchSpec", rt: "RuntimeSpec", matrix: "Matrix") -> EnvSpec:
    """The environment that hosts runtime ``rt`` for ``torch_spec``.

    Runtimes of one family at their default versions share an environment; a runtime pinned to
    another version gets an environment of its own (two versions of a package cannot coexist).
    """
    info = runtime_info(rt.name)
    if rt.version is None:
        members = [r for r in matrix.runtimes
                   if r.version is None and runtime_info(r.name).family == info.family]
    else:
        members = [rt]
    if torch_spec.existing:
        return existing_spec(torch_spec.found, rt, members)
    from harness.matrix.config import COMPANIONS

    pins = {**companion_pins(torch_spec.version),
            **{k: getattr(torch_spec, k) for k in COMPANIONS if getattr(torch_spec, k)}}
    packages = [f"torch=={torch_spec.version}"] + [_req(k, v) for k, v in sorted(pins.items())]
    runtime_options = {}
    for r in members:
        ri = runtime_info(r.name)
        runtime_options[r.label] = dict(r.options)
        if ri.registry == "npm":
            # An npm package: the worker's adapter installs it from the kept lockfile; the
            # version reaches it (and the cells' cache keys) through the runtime's options.
            runtime_options[r.label]["npm_version"] = r.version or ri.default_version
        else:
            packages.append(f"{ri.package}=={r.version or ri.default_version}")
        packages.extend(ri.extra_packages)
    packages.extend(step_packages(matrix, packages, torch_spec.extras))
    packages.extend(torch_spec.extras)
    packages = list(dict.fromkeys(packages))
    install = matrix.install
    spec = EnvSpec(
        name="", torch=torch_spec.version, python=torch_spec.python or install.python,
        family=info.family, packages=packages, runtimes=[r.label for r in members],
        needs_gpu=any(runtime_info(r.name).needs_gpu for r in members),
        runtime_options=runtime_options,
        find_links=[p for p in dict.fromkeys([*install.find_links,
                                              *(pip_find_links() if install.use_pip_config and not info.needs_gpu else [])])
                    if Path(p).exists()],
        index_url=install.index_url, extra_index_urls=list(install.extra_index_urls),
    )
    suffix = "" if rt.version is None else f"-{rt.name}{rt.version}"
    spec.name = f"torch{torch_spec.version}-{info.family}{suffix}-{spec.spec_hash[:8]}"
    return spec


def step_packages(matrix: "Matrix", packages: list[str], extras: list[str]) -> list[str]:
    """The libraries of the matrix's pipeline steps this environment does not hold yet, at their
    default pins (``STEP_PINS``; an ``extras`` requirement of the same package wins). The ORT
    steps need onnxruntime: an environment without any build of it gets the CPU one. Nothing for
    a matrix without pipelines: its environments stay the ones they were."""
    from harness.core.steps import STEP_PINS, STEPS

    used = {STEPS[s["step"]].package for steps in matrix.pipelines.values() for s in steps if s["step"] in STEPS}
    have = {_name(p) for p in [*packages, *extras]}
    out = []
    for package in sorted(used):
        if package == "onnxruntime":
            if not any(h.startswith("onnxruntime") for h in have):
                out.append(f"onnxruntime=={runtime_info('ort-cpu').default_version}")
        elif package not in have and package in STEP_PINS:
            out.append(f"{package}=={STEP_PINS[package]}")
    return out


def _name(requirement: str) -> str:
    import re

    return re.split(r"[<>=!~\[; @]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def existing_spec(found: ExistingEnv, rt: "RuntimeSpec", members: list["RuntimeSpec"]) -> EnvSpec:
    """The environment an existing one (an interpreter, a local image) is for runtime ``rt``:
    nothing to install; the runtimes whose module is missing there (or whose pinned release is
    not the one installed) are ``absent``, each with the reason its cells are skipped for."""
    info = runtime_info(rt.name)
    versions = found.versions
    absent: dict[str, str] = {}
    for r in members:
        ri = runtime_info(r.name)
        # Said without the environment's path: a result stands for every path to the same set.
        if ri.registry == "npm":
            absent[r.label] = (f"{r.name} installs its npm package when it runs; an existing environment "
                               "is used as it is")
        elif ri.module not in found.modules:
            absent[r.label] = (f"{ri.package} is not installed in this existing environment (no module "
                               f"{ri.module!r}); it is used as it is: install {ri.package} there to run these cells")
        elif r.version is not None and versions.get(ri.package) != r.version:
            has = versions.get(ri.package)
            absent[r.label] = (f"{r.label}: this existing environment has {ri.package} "
                               f"{has or 'from another distribution'}, not {r.version}")
    spec = EnvSpec(
        name="", torch=found.release, python=found.python_version, family=info.family, packages=[],
        runtimes=[r.label for r in members], needs_gpu=any(runtime_info(r.name).needs_gpu for r in members),
        runtime_options={r.label: dict(r.options) for r in members}, existing=found, absent=absent)
    suffix = "" if rt.version is None else f"-{rt.name}{rt.version}"
    spec.name = f"torch{found.release}-{info.family}{suffix}-existing-{found.identity[:8]}"
    return spec


def pip_find_links() -> list[str]:
    """find-links folders from pip's own configuration (uv does not read it): wheels a machine
    keeps on disk, such as a CPU build of torch, are then used before downloading."""
    import configparser

    files = [Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"),
             Path.home() / ".config" / "pip" / "pip.conf", Path.home() / ".pip" / "pip.conf"]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    links: list[str] = []
    for path in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        for section in ("global", "install"):
            links += parser.get(section, "find-links", fallback="").split()
    links += os.environ.get("PIP_FIND_LINKS", "").split()
    return [link for link in links if not link.startswith(("http://", "https://"))]


def _req(name: str, value: str) -> str:
    return f"{name}{value}" if value[0] in "<>=!~" else f"{name}=={value}"
