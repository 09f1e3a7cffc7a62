"""The adapter interface every runtime implements (prepare / activate / infer / deactivate).

Public methods guard state and call ``*_impl``; vendor libraries are imported inside the
implementations so that an environment without one runtime still runs the others. An adapter is
used only through its context manager (``with adapter:``, or ``ActiveAdapters`` where the block
that loads is not the block that runs); ``LoadOptions`` are its loader's options.
"""
from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np


def match_feeds(feeds: dict[str, Any], graph_inputs: list[str]) -> dict[str, Any]:
    """The feeds by the graph's input names: by name where the graph keeps the case's names, else
    by position (an exporter renamed them); a ``ValueError`` when neither fits."""
    if all(n in feeds for n in graph_inputs):
        return {n: feeds[n] for n in graph_inputs}
    values = list(feeds.values())
    if len(values) == len(graph_inputs):
        return dict(zip(graph_inputs, values))
    missing = [n for n in graph_inputs if n not in feeds]
    raise ValueError(f"graph inputs {graph_inputs} do not match case inputs {list(feeds)}; "
                     f"unknown: {missing}")


class RuntimeUnavailable(Exception):
    """The runtime cannot run here (package missing, no device, no driver): a skip, not a failure."""


@dataclass(frozen=True)
class LoadOptions:
    """How the adapter's loader makes its session (Polygraphy's loader options; the runner is
    built from the loader). The defaults are what a matrix cell runs; diagnosis varies them."""

    graph_optimizations: bool = True     # False: the runtime's graph optimisations off
    optimized_model: Path | None = None  # where the runtime writes the graph it optimised
    # A folder where the runtime keeps the models it compiled, for another process to load
    # instead of compiling the file again (OpenVINO's model cache, CACHE_DIR): the latency
    # phase's workers of one environment share one (``Job.compiled_cache``).
    compiled_cache: Path | None = None


class ActiveAdapters(contextlib.ExitStack):
    """Adapters entered through their context manager (``enter_context``) where one ``with`` cannot
    hold the block: the stage that loads is not the stage that runs. On exit each is deactivated;
    one whose deactivation fails is named on stdout (the cell's log), not raised: closing a
    session says nothing of the file, and must not replace the outcome it closes on."""

    def __exit__(self, *exc: Any) -> bool:
        try:
            return super().__exit__(*exc)
        except Exception as error:  # noqa: BLE001 - see the docstring: a close is never a verdict
            print(f"runtime adapter did not deactivate: {type(error).__name__}: {error}", flush=True)
            return False


class RuntimeAdapter(abc.ABC):
    name: str = "runner"
    # The ``LoadOptions`` fields this runtime's loader honours; asking another is refused at
    # activation (a session that ignored "optimisations off" would answer the wrong question).
    load_options: frozenset[str] = frozenset()

    def __init__(self, model_path: Path, threads: int | None = None, precision: str = "fp32",
                 options: dict[str, Any] | None = None, load: LoadOptions | None = None) -> None:
        self.model_path = Path(model_path)
        self.load = load or LoadOptions()
        self.threads = threads
        self.precision = precision
        self.options = dict(options or {})
        self.is_active = False
        self.facts: dict[str, Any] = {"precision": precision}

    # -- availability -------------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the runtime can run here, otherwise why not (checked with the real API)."""
        return None

    @classmethod
    def version(cls) -> str | None:
        return None

    # -- lifecycle ------------------------------------------------------------------------------
    def prepare(self, shapes: list[dict[str, tuple[int, ...]]]) -> None:
        """Called before ``activate`` with every input shape the cell will run (example shape
        first). Runtimes that build for given shapes (TensorRT's optimisation profile) keep them;
        the default ignores them."""

    def activate(self) -> "RuntimeAdapter":
        if self.is_active:
            raise RuntimeError(f"{self.name} runner is already active")
        reason = self.unavailable_reason()
        if reason:
            raise RuntimeUnavailable(reason)
        asked = {k for k, v in vars(self.load).items() if v != getattr(LoadOptions(), k)}
        if asked - self.load_options:
            raise RuntimeUnavailable(f"{self.name} has no loader option {', '.join(sorted(asked - self.load_options))}")
        self.activate_impl()
        self.is_active = True
        return self

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not self.is_active:
            raise RuntimeError(f"{self.name} runner must be activated before infer()")
        return self.infer_impl(feeds)

    def timed_call(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        """A zero-argument callable doing one synchronous inference, for the latency protocol."""
        return lambda: self.infer(feeds)

    def deactivate(self) -> None:
        if self.is_active:
            self.deactivate_impl()
            self.is_active = False

    def input_names(self) -> list[str]:
        return self.input_names_impl()

    def __enter__(self) -> "RuntimeAdapter":
        return self.activate()

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    # -- implementations ------------------------------------------------------------------------
    @abc.abstractmethod
    def activate_impl(self) -> None: ...

    @abc.abstractmethod
    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    @abc.abstractmethod
    def input_names_impl(self) -> list[str]: ...

    def deactivate_impl(self) -> None:
        pass
