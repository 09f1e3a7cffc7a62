"""`matrix`: run a matrix."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli import _options as opts

if TYPE_CHECKING:
    from harness.matrix_run import MatrixRequest

HELP = "run a matrix"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.matrix_run import MatrixRequest

    def default(name: str) -> Any:
        return opts.default_of(MatrixRequest, name)

    opts.config(p)
    p.add_argument("--output", type=Path, default=default("output"), help="run directory (default: reports/runs/<run-id>)")
    p.add_argument("--provider", choices=opts.PROVIDERS, default=default("provider"))
    p.add_argument("--resume", action="store_true",
                   help="continue the newest unfinished run of this matrix (same matrix hash)")
    p.add_argument("--force-resume", action="store_true",
                   help="resume (--output DIR or --resume) even if the run was started from another matrix")
    p.add_argument("--jobs", type=opts.positive_int, default=default("jobs"), metavar="N",
                   help="verdict workers at once (default: the matrix's jobs, else one per core); "
                        "latency is always timed alone, after them")
    p.add_argument("--fresh", nargs="?", const="all", choices=("all", "latency"), default=default("fresh"),
                   help="run every cell again instead of taking unchanged ones from the store; "
                        "--fresh=latency: only passing cells run again (fresh timings)")
    opts.shard(p)
    opts.verbose(p)
    opts.store(p)
    p.set_defaults(func=run)


def _request(args: argparse.Namespace, **kw: Any) -> MatrixRequest:
    from harness.matrix_run import MatrixRequest

    return MatrixRequest(args.config, only=args.only, shard=getattr(args, "shard", None),
                         reports=args.reports, durations=getattr(args, "durations", "auto"),
                         torch=getattr(args, "torch", None), **kw)


def summary(run_dir: Path, limit: int = 10) -> list[str]:
    """What a finished run prints: the counts, the failures grouped by signature (most cells
    first), the optional passes that could not be made, where the reports are."""
    from collections import Counter

    from harness.core.record import count_by_status
    from harness.report.passes import summary_lines
    from harness.store.runs import load_run

    meta, records = load_run(run_dir)   # records with their reductions
    counts = count_by_status(records)
    lines = [f"{len(records)} cells: " + " · ".join(f"{k} {v}" for k, v in counts.items() if v)]
    lines += phase_lines(meta.extra.get("schedule") or {}, records)
    own = [r for r in records if r.status.is_own_error]
    if own:
        lines.append(f"{len(own)} cells have no verdict: the matrix's own code failed on them (not the "
                     "model's fault; report it to the project with the cell's log):")
        lines += [f"  {r.cell_id}: {(r.error or '').splitlines()[0][:110] if r.error else ''}" for r in own[:limit]]
    failing = [r for r in records if r.status.is_failure]
    groups = Counter(r.signature or f"{r.stage}:?" for r in failing)
    if groups:
        lines.append(f"failures by signature ({len(groups)}):")
        first = {}
        for r in failing:
            first.setdefault(r.signature or f"{r.stage}:?", r)
        for signature, n in groups.most_common(limit):
            r = first[signature]
            error = (r.error or r.status.value).splitlines()[0][:110]
            lines.append(f"  {n:4d} × {signature}  {error}")
        if len(groups) > limit:
            lines.append(f"  … {len(groups) - limit} more in matrix.md")
    lines += summary_lines(records)   # optional passes that could not be made, each with its reason
    md = run_dir / "matrix.md"
    lines.append(f"report: {md.with_suffix('.html')} · {md}")
    return lines


def phase_lines(schedule: dict[str, Any], records: list[Any]) -> list[str]:
    """How long each phase took, the latency phase's share, and how the exported files were made
    (one capture shared by the opsets of a case, release and options, or one export each)."""
    from collections import Counter

    lines = []
    verdicts, latency = schedule.get("verdict_phase_s"), schedule.get("latency_phase_s")
    if isinstance(verdicts, (int, float)) and isinstance(latency, (int, float)) and verdicts + latency > 0:
        lines.append(f"phases: verdicts {verdicts:.0f} s · latency {latency:.0f} s "
                     f"({latency / (verdicts + latency):.0%} of the two)")
    made = Counter((r.export_made or {}).get("how") for r in records if r.exporter == "dynamo" and r.export_made)
    if made:
        lines.append("dynamo exports: " + " · ".join(f"{how} {n} cells" for how, n in made.most_common()))
    return lines


def run(args: argparse.Namespace) -> int:
    from harness.cli.logger import result, say
    from harness.matrix_run import run_matrix

    run_dir = run_matrix(_request(args, output=args.output, provider=args.provider, resume=args.resume,
                                    force_resume=args.force_resume, jobs=args.jobs, fresh=args.fresh,
                                    verbose=args.verbose))
    for line in summary(run_dir):
        say(line)
    result(f"run directory: {run_dir}")
    return 0
