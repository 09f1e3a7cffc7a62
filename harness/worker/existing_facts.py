"""Run inside an existing environment, by its own interpreter (``python -I -c <this file's text>
MODULE...``): what is installed there, as one JSON line on stdout after ``PREFIX``.

Standard library only, and syntax Python 3.6 parses, so that an interpreter too old for the
harness still says which Python it is. Nothing is written inside the environment: the caller points the
bytecode cache outside it (``-X pycache_prefix``, the one the workers use) and runs it isolated
(``-I``: no PYTHONPATH, no user site-packages, no current directory), as the worker then sees it.
"""
import csv
import hashlib
import json
import platform
import re
import sys

PREFIX = "HARNESS-ENV-PROBE "
# Files an installer writes per environment, not per release: scripts outside site-packages
# (their first line names the interpreter), the metadata folder (INSTALLER, direct_url.json
# with a local path, RECORD itself), compiled bytecode (no hash in RECORD anyway).
_PER_ENVIRONMENT = re.compile(r"^(\.\./|/)|\.(dist|egg)-info/|\.pyc$")


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def files_digest(dist):
    """A digest of a distribution's files as its RECORD lists them (path and hash of each),
    without the files an installer writes per environment; "" when it has no RECORD with hashes
    (conda and system packages often have none: their name and version stand for them)."""
    text = dist.read_text("RECORD") or ""
    rows = []
    for row in csv.reader(text.splitlines()):
        if len(row) >= 2 and row[1] and not _PER_ENVIRONMENT.search(row[0]):
            rows.append(row[0] + "," + row[1])
    if not rows:
        return ""
    return hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()[:16]


def installed():
    """name → (version, digest) of every distribution importable here; the first one on sys.path
    wins, as it does for an import."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if not name or canonical(name) in found:
            continue
        try:
            digest = files_digest(dist)
        except (OSError, UnicodeDecodeError, csv.Error):
            digest = ""
        found[canonical(name)] = (dist.version, digest)
    return found


def torch_facts():
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 - any failure to import torch is the answer
        return {"torch_error": f"{type(exc).__name__}: {exc}"}
    facts = {"torch": str(torch.__version__), "cuda": getattr(torch.version, "cuda", None)}
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001 - a broken driver is a fact, not a probe failure
        facts["cuda_available"] = f"{type(exc).__name__}: {exc}"
    return facts


def _importable(find_spec, module):
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def main(modules):
    out = {"python_version": platform.python_version(), "implementation": sys.implementation.name,
           "executable": sys.executable, "prefix": sys.prefix,
           "platform": f"{sys.platform}-{platform.machine()}"}
    if sys.version_info >= (3, 8):
        from importlib.util import find_spec

        dists = installed()
        out["installed"] = sorted(f"{n}=={v}" for n, (v, _) in dists.items())
        out["hashes"] = {n: d for n, (_, d) in dists.items() if d}
        out["modules"] = [m for m in modules if _importable(find_spec, m)]
        out.update(torch_facts())
    sys.stdout.write("\n" + PREFIX + json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
