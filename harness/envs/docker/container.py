"""Run one worker in a container, as if it were a local process (the Docker provider's worker).

The runner starts ``python -m harness.envs.docker.container --image TAG [--gpus] --job JOB --events-fd N``
exactly like a venv worker and supervises it the same way. This process creates the container
through the Docker SDK (run directory and matrix folder mounted at the same absolute paths, the
invoking user's uid, ``--init`` so that a worker killed by a signal is reported as such), and:

- an existing image (``--python``, ``--harness``: ``harness.envs.existing_provider``): the
  image's own interpreter is the entry point and this checkout's harness is mounted read-only at
  its host path and put on PYTHONPATH (an image built from images/ carries its copy instead).
- events: the worker writes its JSON events to the container's stdout (``--events-fd 1``); lines
  that are events are relayed to fd N, anything else (stray prints) to this process's stdout, the
  worker log. Attaching to the container streams (not its logs) keeps long lines whole.
- crash: the container's exit status is mirrored (128+n becomes death by signal n), so the
  runner records the same `crash` verdict as for a venv worker.
- timeout: the runner SIGKILLs this process group, which cannot clean up; a watchdog in its own
  session notices the end of this process (EOF on a pipe) and removes the container.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.core.cell import CaseRef
from harness.core.job import Job
from harness.core.wire import CONTAINER_MODULE, RUNNER_PID_ENV, WORKER_MODULE

# Variables the worker's behaviour depends on; everything else of the host stays outside.
FORWARD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")
FORWARD_PREFIXES = ("HARNESS_",)
# Host pids mean nothing in the container's pid namespace: the worker there must not compare its
# parent with the runner's pid (it would exit at once); the container goes with this process.
HOST_ONLY = (RUNNER_PID_ENV,)


def container_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if (k in FORWARD or k.startswith(FORWARD_PREFIXES)) and k not in HOST_ONLY}


def mounts_for(job: Job, harness: Path | None = None):
    """The run directory read-write; the matrix folder, the folders of case files and (an
    existing image's) the harness read-only, all at their host paths, so that every path in the
    job means the same inside."""
    from docker.types import Mount

    run_dir = Path(job.run_dir).resolve()
    folders = {Path(job.base_dir).resolve()} if job.base_dir else set()
    if harness is not None:
        folders.add(Path(harness).resolve())
    for group in job.groups:
        ref = CaseRef.try_parse(group.case_ref)
        if ref is not None and ref.is_file:
            folders.add(Path(ref.target).resolve().parent)
    mounts = [Mount(str(run_dir), str(run_dir), type="bind")]
    for folder in sorted(folders):
        covered = folder == run_dir or run_dir in folder.parents or folder == Path("/")
        if folder.is_dir() and not covered and not any(f in folder.parents for f in folders):
            mounts.append(Mount(str(folder), str(folder), type="bind", read_only=True))
    return mounts


def is_event(line: bytes) -> bool:
    if not line.startswith(b"{"):
        return False
    try:
        return "event" in json.loads(line)
    except ValueError:
        return False


def start_watchdog(container_id: str) -> subprocess.Popen:
    # Its own session: the runner's killpg of this process group must not reach it.
    return subprocess.Popen([sys.executable, "-m", CONTAINER_MODULE, "--watch", container_id],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def watch(container_id: str) -> int:
    """Block until the parent's end of stdin closes, then remove the container if still there."""
    sys.stdin.buffer.read()
    import docker
    import docker.errors

    try:
        docker.from_env().containers.get(container_id).remove(force=True)
    except docker.errors.NotFound:
        pass
    return 0


def run_container(args: argparse.Namespace) -> int:
    import docker
    from docker.types import DeviceRequest

    job = Job.read(args.job)
    client = docker.from_env()
    name = f"harness-{os.getpid()}-{args.job.stem}"
    worker = ["-m", WORKER_MODULE, "--job", str(args.job.resolve()), "--events-fd", "1"]
    environment = container_environment()
    if args.harness is None:    # an image built from images/: the harness is its /opt/harness
        command, entrypoint = ["python", *worker], None
    else:                       # an existing image: this checkout's harness, mounted read-only
        command, entrypoint = worker, [args.python or "python3"]
        environment.update(PYTHONPATH=str(Path(args.harness).resolve()), PYTHONNOUSERSITE="1",
                           PYTHONDONTWRITEBYTECODE="1", HOME="/tmp")
    container = client.containers.create(
        args.image, command=command, entrypoint=entrypoint, name=name, environment=environment,
        mounts=mounts_for(job, args.harness), user=f"{os.getuid()}:{os.getgid()}", init=True,
        network_mode=os.environ.get("HARNESS_DOCKER_NETWORK", "host"),
        working_dir=job.run_dir, labels={"torch-onnx-matrix.worker": job.run_id},
        device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])] if args.gpus else None)
    watchdog = start_watchdog(container.id)
    events = os.fdopen(args.events_fd, "wb", buffering=0)
    try:
        stream = container.attach(stdout=True, stderr=True, stream=True, demux=True, logs=True)
        container.start()
        pending = b""
        for out, err in stream:
            if err:
                sys.stderr.buffer.write(err)
                sys.stderr.flush()
            if out:
                pending += out
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    target = events if is_event(line) else sys.stdout.buffer
                    target.write(line + b"\n")
                sys.stdout.flush()
        if pending:
            sys.stdout.buffer.write(pending + b"\n")
        status = container.wait().get("StatusCode", 1)
    finally:
        events.close()
        container.remove(force=True)
        watchdog.stdin.close()
        watchdog.wait()
    if 128 < status < 128 + 65:
        # tini exits 128+n when the worker died of signal n: die the same way for the runner.
        sys.stdout.flush()
        sig = status - 128
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=CONTAINER_MODULE)
    parser.add_argument("--image")
    parser.add_argument("--gpus", action="store_true", help="give the container every GPU")
    parser.add_argument("--python", help="an existing image's interpreter (its entry point is not used)")
    parser.add_argument("--harness", type=Path, help="an existing image: mount this harness and import it")
    parser.add_argument("--job", type=Path)
    parser.add_argument("--events-fd", type=int)
    parser.add_argument("--watch", metavar="CONTAINER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.watch:
        return watch(args.watch)
    if not (args.image and args.job and args.events_fd is not None):
        parser.error("--image, --job and --events-fd are required")
    return run_container(args)


if __name__ == "__main__":
    sys.exit(main())
