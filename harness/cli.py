"""Command line: ``python -m harness SUBCOMMAND`` — every entry point of the tool, one parser.

matrix, plan, merge, report, publish, gate, bisect, reduce, view, images, base-image, bench,
gpu-check; the nox sessions of the same names call these. Exit codes: 0 success; 1 a finding
(gate regression, a failed image build, a broken GPU runtime, nothing to bisect); 2 bad input
(a config, an argument, a store, an environment that cannot be installed); 3 an unexpected error
(one line on stderr, the traceback in a file it names); 128 + N interrupted by signal N (the run
is resumable). The gate never exits 1 but for a regression: any error there is 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.paths import DEFAULT_CONFIG, REPORTS
from harness.core.record import SchemaError
from harness.core.text import ENCODE_ERRORS
from harness.envs.provider import PROVIDERS
from harness.matrix.rules import ConfigError

if TYPE_CHECKING:
    from harness.pipeline import MatrixRequest


def _request(args: argparse.Namespace, **kw: Any) -> MatrixRequest:
    from harness.pipeline import MatrixRequest

    return MatrixRequest(args.config, only=args.only, shard=getattr(args, "shard", None),
                         reports=args.reports, durations=getattr(args, "durations", "auto"),
                         torch=getattr(args, "torch", None), **kw)


def cmd_matrix(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harness.pipeline import run_matrix

    run_dir = run_matrix(_request(args, output=args.output, provider=args.provider, resume=args.resume,
                                    force_resume=args.force_resume, jobs=args.jobs, fresh=args.fresh))
    md = run_dir / "matrix.md"
    console = Console(stderr=True)
    if md.exists() and md.stat().st_size < 20000:
        console.print(md.read_text(), markup=False, highlight=False)
    console.print(f"matrix: {md} · {md.with_suffix('.html')}", markup=False)
    print(f"run directory: {run_dir}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.report import render_run
    from harness.run.execute import finalize
    from harness.store.merge import merge_runs
    from harness.store.runs import read_run_meta

    if args.wait < 0:
        raise ConfigError(f"--wait: expected seconds >= 0 (got {args.wait})")
    run_dir = merge_runs(args.runs, args.output, wait_s=args.wait)
    finalize(run_dir, read_run_meta(run_dir), args.reports)
    render_run(run_dir, args.reports)
    print(f"merged {len(args.runs)} shard runs into {run_dir}")
    return 0


def _print_plan(plan: Any, out: Any) -> None:
    for env in plan.environments:
        print(f"{env.env.name}: {' '.join(env.env.packages)}", file=out)
        for cell in env.cells:
            print(f"  {cell.cell_id}", file=out)
    print(f"{len(plan.cells)} cells in {len(plan.environments)} environments", file=out)


def _plan_args(args: argparse.Namespace) -> list[str]:
    """The arguments that decide the plan, as a shard job passes them (--config relative to the
    checkout when it lies inside it, so a job in another checkout or an image finds it)."""
    from harness.core.paths import PROJECT_ROOT

    config = args.config.resolve()
    out = ["--config", str(config.relative_to(PROJECT_ROOT) if config.is_relative_to(PROJECT_ROOT) else config)]
    if args.only:
        out += ["--only", args.only]
    if args.torch:
        out += ["--torch", args.torch]
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    """The plan as text (optionally one shard of it), or sharded for an engine (json, github, k8s)."""
    import contextlib
    import json

    from harness.matrix.engines import github_matrix, plan_document, render_k8s
    from harness.matrix.shards import balance, shard_count
    from harness.pipeline import load_request_matrix, plan_for, plan_shards

    if args.shard and args.shards is not None:
        raise ConfigError("plan: give --shard K/N (one shard's cells) or --shards N (the split), not both")
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(args.output, "w", encoding="utf-8", errors=ENCODE_ERRORS)) if args.output else sys.stdout
        if args.format == "text" and args.shards is None:
            _print_plan(plan_for(_request(args)), out)
            return 0
        if args.shard:
            raise ConfigError(f"plan: --shard prints one shard as text; for --format {args.format} "
                              "give --shards N")
        _, whole = load_request_matrix(_request(args))
        requested = 1 if args.shards is None else args.shards
        count = shard_count(whole, requested, args.min_shard_cells) if whole.cells else requested
        plan, shards, costs = plan_shards(_request(args), count)
        if args.format == "github":
            print(json.dumps(github_matrix(shards, args.cpu_runner_label, args.gpu_runner_label),
                             separators=(",", ":")), file=out)
            return 0
        document = plan_document(plan, shards, costs, _plan_args(args), args.cpu_runner_label,
                                 args.gpu_runner_label)
        if args.format == "json":
            print(json.dumps(document, indent=1), file=out)
        elif args.format == "k8s":
            print(render_k8s(document, args.image, args.pvc, args.storage, args.gpu_resource or None),
                  end="", file=out)
        else:
            b = balance(shards)
            for s in shards:
                runs_on = document["shards"][s.index - 1]["runs-on"]
                runs_on = runs_on if isinstance(runs_on, str) else ",".join(runs_on)
                print(f"shard {s.label}: {len(s.cells)} cells, ~{s.estimated_s:.0f} s, runs-on "
                      f"{runs_on}: {' '.join(s.environments)}", file=out)
            print(f"{len(plan.cells)} cells in {len(shards)} shards; largest/mean {b['ratio']} "
                  f"(durations: {costs.source})", file=out)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Re-render report files from stored results; results.jsonl and run.json are only read."""
    from harness.report import render_run
    from harness.report.html import write_store_index
    from harness.store.runs import read_run_meta, resolve_run

    for ref in args.runs or ["latest"]:
        run_dir = resolve_run(ref, args.reports)
        path = render_run(run_dir, args.reports)
        print(f"{read_run_meta(run_dir).run_id}: {path} {path.with_name('matrix.html')}")
    if (args.reports / "index.json").exists():
        print(f"index: {write_store_index(args.reports)}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from harness.report.html import write_site

    site = args.site or args.reports / "site"
    index = write_site(args.reports, site)
    print(f"site: {index.parent} (open {index})")
    return 0


def cmd_reduce(args: argparse.Namespace) -> int:
    """Reduce failing cells of a stored run to the smallest graph that still fails."""
    from harness.report import render_run
    from harness.run.reduce import reduce_run
    from harness.store.runs import resolve_run

    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be > 0 (got {args.timeout})")
    run_dir = resolve_run(args.run, args.reports)
    try:
        results = reduce_run(run_dir, args.cell or None, args.timeout)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not results:
        print(f"{run_dir.name}: no failing cell at load, run or parity with a bundle: nothing to reduce")
        return 0
    render_run(run_dir, args.reports)
    print(f"{len(results)} cell(s) reduced into their bundles; reports re-rendered: {run_dir / 'matrix.md'}")
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate.compare import Settings
    from harness.gate.main import GateRequest, run_gate

    settings = Settings(args.latency_threshold, args.alpha, args.parity_factor, tuple(args.block_on or ()))
    return run_gate(GateRequest(args.baseline, args.candidate, args.config, args.reports, args.output,
                                args.provider, settings, args.remeasure))


def cmd_bisect(args: argparse.Namespace) -> int:
    from harness.gate.bisect import BisectRequest, run_bisect

    releases = [v.strip() for v in args.releases.split(",") if v.strip()] if args.releases else None
    return run_bisect(BisectRequest(args.good, args.bad, args.config, args.reports, args.cell, releases,
                                    args.provider))


def cmd_view(args: argparse.Namespace) -> int:
    from harness.report.view import view_cell

    return view_cell(args.cell, args.run, args.reports, reduced=args.reduced, browse=args.browse,
                     port=args.port)


def cmd_images(args: argparse.Namespace) -> int:
    """Build the image of every environment the (filtered) plan needs; existing tags are kept."""
    from rich.console import Console

    from harness.envs.docker.provider import DockerProvider
    from harness.envs.provider import EnvironmentBuildError
    from harness.pipeline import plan_for

    plan = plan_for(_request(args))
    provider = DockerProvider(log=Console(stderr=True).print)
    built = failed = 0
    for env_plan in plan.environments:
        spec = env_plan.env
        if why := provider.skip_reason(spec):
            print(f"skip {spec.name}: {why}")
            continue
        try:
            marker = provider.ensure(spec)
        except EnvironmentBuildError as exc:
            print(f"error: {spec.name}: {exc}", file=sys.stderr)
            failed += 1
            continue
        built += not marker.reused
        print(f"{spec.name}: {marker.extra['image']}" + ("" if marker.reused else
                                                         f" (built in {marker.install_s} s)"))
    if not built and not failed:
        print("up to date")
    return 1 if failed else 0


def cmd_base_image(args: argparse.Namespace) -> int:
    """Bootstrap the local Debian base image (debootstrap + docker import) unless it exists."""
    import time

    from harness.envs.docker.base import LOCAL_BASE, bootstrap_base
    from harness.envs.docker.provider import DockerUnavailable, docker_client

    try:
        client = docker_client()
    except DockerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bootstrap_base(client, args.name or LOCAL_BASE, mirror=args.mirror, force=args.force)
    print(f"base image ready in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from harness.checks.bench import run_bench

    return run_bench(args.config, args.only, args.reports)


def cmd_gpu_check(args: argparse.Namespace) -> int:
    from harness.checks.gpu import run_gpu_check

    return run_gpu_check(args.config, args.output)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 (got {text!r})")
    return value


def _config(p: argparse.ArgumentParser, default: Path = DEFAULT_CONFIG, only: bool = True) -> None:
    p.add_argument("--config", type=Path, default=default, help=f"matrix file (default: {default.name})")
    if only:
        p.add_argument("--only", default=None,
                       help="filter cells, e.g. torch=2.13.0,exporter=dynamo|torchscript")


def _shard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="only shard K of N: environment-affine, balanced by previous durations")
    p.add_argument("--durations", default="auto",
                   help="what shards are balanced by: auto (newest finished runs in the store), none "
                        "(cell count), a run, or a JSON file (plan --format json); every shard of a "
                        "split needs the same")
    p.add_argument("--torch", default=None, metavar="V,V",
                   help="exactly these torch releases, as the gate plans them (unlisted ones get "
                        "default companion pins)")


def _store_option(p: argparse.ArgumentParser) -> None:
    # Also accepted after the subcommand, where `nox -s report -- ...` puts it.
    p.add_argument("--reports", type=Path, default=argparse.SUPPRESS, help="results store (default: reports/)")


def build_parser() -> argparse.ArgumentParser:
    from harness.checks import bench, gpu
    from harness.gate.compare import DEFAULT_PARITY_FACTOR
    from harness.gate.stats import DEFAULT_ALPHA, DEFAULT_RATIO
    from harness.matrix.engines import GPU_RUNNER, HOSTED_RUNNER

    parser = argparse.ArgumentParser(prog="harness", description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=REPORTS, help="results store (default: reports/)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("matrix", help="run a matrix")
    _config(p)
    p.add_argument("--output", type=Path, default=None, help="run directory (default: reports/runs/<run-id>)")
    p.add_argument("--provider", choices=PROVIDERS, default="venv")
    p.add_argument("--resume", action="store_true",
                   help="continue the newest unfinished run of this matrix (same matrix hash)")
    p.add_argument("--force-resume", action="store_true",
                   help="resume (--output DIR or --resume) even if the run was started from another matrix")
    p.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                   help="verdict workers at once (default: the matrix's jobs, else one per core); "
                        "latency is always timed alone, after them")
    p.add_argument("--fresh", nargs="?", const="all", choices=("all", "latency"), default=None,
                   help="run every cell again instead of taking unchanged ones from the store; "
                        "--fresh=latency: only passing cells run again (fresh timings)")
    _shard_options(p)
    _store_option(p)
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("merge", help="merge finished shard runs into one run")
    p.add_argument("runs", nargs="+", type=Path, help="shard run directories (every shard of one split)")
    p.add_argument("--output", type=Path, required=True,
                   help="directory of the merged run (must not exist or be empty)")
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                   help="wait up to this long for shards still running (Kubernetes; default 0)")
    _store_option(p)
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("plan", help="print environments and cells without running them; shard them for CI")
    _config(p)
    _shard_options(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="split into N shards (fewer when more would not shorten the longest one)")
    p.add_argument("--format", choices=("text", "json", "github", "k8s"), default="text",
                   help="text (default), json (shards with their cells and durations), github "
                        "(strategy.matrix JSON), k8s (Indexed Job manifests)")
    p.add_argument("--min-shard-cells", type=int, default=1, metavar="M",
                   help="at most one shard per M cells: a small matrix stays one job (default 1)")
    p.add_argument("--cpu-runner-label", default=HOSTED_RUNNER,
                   help=f"runs-on of CPU shards (default {HOSTED_RUNNER})")
    p.add_argument("--gpu-runner-label", default=GPU_RUNNER,
                   help=f"runs-on of GPU shards, comma-separated labels (default {GPU_RUNNER}); empty: "
                        "no GPU runner, GPU shards run on the CPU label and their GPU cells are skips")
    p.add_argument("--image", default="torch-onnx-matrix:latest",
                   help="k8s: image holding this checkout as its working directory (pip install -e .)")
    p.add_argument("--pvc", default="torch-onnx-matrix-runs", help="k8s: shared volume claim for shard runs")
    p.add_argument("--storage", default="200Gi", help="k8s: size of that claim (default 200Gi)")
    p.add_argument("--gpu-resource", default="",
                   help="k8s: resource GPU shards request, e.g. nvidia.com/gpu (a second Indexed Job)")
    p.add_argument("--output", type=Path, default=None, help="write to this file instead of stdout")
    _store_option(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("report", help="re-render reports from stored results")
    p.add_argument("runs", nargs="*", help="run ids or directories (default: latest)")
    _store_option(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("publish", help="write a static site of every run (GitHub Pages ready)")
    p.add_argument("--site", type=Path, default=None, help="output folder (default: reports/site)")
    _store_option(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("gate", help="compare a candidate torch against a baseline; exit 1 on regression")
    p.add_argument("--baseline", required=True, help="torch version, run id/directory, or RUN@VERSION")
    p.add_argument("--candidate", required=True, help="torch version, run id/directory, or RUN@VERSION")
    _config(p, only=False)
    p.add_argument("--output", type=Path, default=None, help="gate directory (default: reports/gates/<timestamp>)")
    p.add_argument("--provider", choices=PROVIDERS, default="venv")
    p.add_argument("--latency-threshold", type=float, default=DEFAULT_RATIO,
                   help=f"median ratio above which a significant slowdown counts (default {DEFAULT_RATIO})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"Mann-Whitney p-value threshold (default {DEFAULT_ALPHA})")
    p.add_argument("--parity-factor", type=float, default=DEFAULT_PARITY_FACTOR,
                   help="max_abs may grow by this many atol before it counts as drift "
                        f"(default {DEFAULT_PARITY_FACTOR})")
    p.add_argument("--block-on", action="append", choices=["io"], default=[],
                   help="also block on graph drift: 'io' = a change of input/output names or dynamic dims")
    p.add_argument("--remeasure", type=int, default=2, metavar="N",
                   help="fresh processes per side to re-measure cells flagged slower (default 2; "
                        "0: count the first measurement)")
    _store_option(p)
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("bisect", help="find the torch release where a cell's verdict changes")
    p.add_argument("--cell", default=None, help="cell id (with or without its torch part) or key name; "
                                                "default: every cell of --config")
    p.add_argument("--good", required=True, help="torch release with the good verdict")
    p.add_argument("--bad", required=True, help="torch release with the bad verdict (older than --good for a fix)")
    _config(p, only=False)
    p.add_argument("--releases", default=None,
                   help="comma-separated releases to search instead of asking the package index")
    p.add_argument("--provider", choices=PROVIDERS, default="venv")
    _store_option(p)
    p.set_defaults(func=cmd_bisect)

    p = sub.add_parser("view", help="open a cell's model.onnx (or reduced.onnx) in Netron")
    p.add_argument("cell", help="cell id (or its key without the torch part, when one run has one match)")
    p.add_argument("--run", default="latest", help="run id or directory (default: latest)")
    p.add_argument("--reduced", action="store_true", help="open reduced.onnx instead of model.onnx")
    p.add_argument("--browse", action=argparse.BooleanOptionalAction, default=None,
                   help="open a browser (default: only when one is available and not in CI)")
    p.add_argument("--port", type=int, default=None, help="port for Netron's server (default: any free one)")
    _store_option(p)
    p.set_defaults(func=cmd_view)

    p = sub.add_parser("reduce", help="reduce failing cells' files to the smallest graph that still fails")
    p.add_argument("run", nargs="?", default="latest", help="run id or directory (default: latest)")
    p.add_argument("--cell", action="append", default=[], metavar="CELL_ID",
                   help="only this cell (repeatable; default: every failure at load, run or parity)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per cell (default 120)")
    _store_option(p)
    p.set_defaults(func=cmd_reduce)

    p = sub.add_parser("images", help="build the Docker images a matrix needs")
    _config(p)
    _shard_options(p)
    _store_option(p)
    p.set_defaults(func=cmd_images)

    p = sub.add_parser("base-image", help="bootstrap the local base image for offline builds")
    p.add_argument("--name", default=None, help="image name (default: the one builds fall back to)")
    p.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses)")
    p.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    p.set_defaults(func=cmd_base_image)

    p = sub.add_parser("bench", help="benchmark the tool itself (environment reuse, throughput, timing floor)")
    _config(p, default=bench.BENCH_MATRIX)
    p.set_defaults(func=cmd_bench, only="torch=2.13.0")
    _store_option(p)

    p = sub.add_parser("gpu-check", help="run the probes on the GPU runtimes and print one line per cell")
    _config(p, default=gpu.GPU_MATRIX, only=False)
    p.add_argument("--output", type=Path, default=None, help="run directory (default: a temporary one)")
    p.set_defaults(func=cmd_gpu_check)
    return parser


def _resolve_paths(args: argparse.Namespace) -> None:
    """Relative --config / --output / --reports are relative to where the user ran the command
    (nox changes into the project root before running a session)."""
    invoked = os.environ.get("HARNESS_INVOKED_FROM")
    if not invoked:
        return
    for name in ("config", "output", "reports"):
        value = getattr(args, name, None)
        if isinstance(value, Path) and not value.is_absolute():
            candidate = Path(invoked) / value
            if name != "config" or candidate.exists() or not value.exists():
                setattr(args, name, candidate)


# Exit codes (see the module docstring).
BAD_INPUT, INTERNAL_ERROR, INTERRUPTED = 2, 3, 130


def _check_paths(args: argparse.Namespace) -> None:
    """Output folders must be folders: a file there is bad input, never a traceback later."""
    for name, option in (("output", "--output"), ("site", "--site"), ("reports", "--reports")):
        value = getattr(args, name, None)
        if isinstance(value, Path) and value.exists() and not value.is_dir():
            raise ConfigError(f"{option} {value}: is a file; expected a directory")


def _traceback_file(args: argparse.Namespace) -> Path | None:
    """Write the current exception's traceback where the user will look; return its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = f"error-{args.command}-{stamp}-{os.getpid()}.log"
    text = f"python -m harness {' '.join(sys.argv[1:])}\n\n{traceback.format_exc()}"
    reports = getattr(args, "reports", None)
    for folder in ([reports / "errors"] if isinstance(reports, Path) else []) + [Path(tempfile.gettempdir())]:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text, encoding="utf-8", errors=ENCODE_ERRORS)
            return folder / name
        except OSError:
            continue
    return None


def _say(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def _safe_streams() -> None:
    """Console output of any text (a case's error with a lone surrogate) never raises."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors=ENCODE_ERRORS)
            except (ValueError, OSError):
                pass


def main(argv: list[str] | None = None) -> int:
    _safe_streams()
    args = build_parser().parse_args(argv)
    _resolve_paths(args)
    gate = args.command == "gate"
    try:
        _check_paths(args)
        code = args.func(args)
        # The gate's contract is 0 (no regression), 1 (regression), 2 (could not tell).
        return code if not gate or code in (0, 1) else BAD_INPUT
    except (ConfigError, FileNotFoundError, SchemaError) as exc:
        _say(str(exc))
        return BAD_INPUT
    except KeyboardInterrupt as exc:
        # A run interrupted by SIGTERM/SIGINT/SIGHUP (harness.run.execute.RunInterrupted) has
        # stopped its workers and stays resumable; the exit code is the shell's for that signal.
        _say("interrupted")
        return BAD_INPUT if gate else 128 + getattr(exc, "signum", INTERRUPTED - 128)
    except SystemExit as exc:
        # sys.exit("message") deep inside is bad input; a bare code passes through, except in the
        # gate, whose verdict only run_gate's return value gives.
        if isinstance(exc.code, str) or gate:
            _say(str(exc.code) if isinstance(exc.code, str) else f"'gate' stopped early (exit {exc.code})")
            return BAD_INPUT
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes an exit code
        where = _traceback_file(args)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        _say(f"unexpected {type(exc).__name__} in '{args.command}': {first} "
             f"(traceback: {where or 'could not be written'})")
        return BAD_INPUT if gate else INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
