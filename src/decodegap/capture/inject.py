"""Wrap the record target in this process, now or when its module finishes importing.

Runs from the sitecustomize that `decodegap record` puts first on PYTHONPATH, so in every Python process
of the recorded program (spawned, forked or started as a subprocess). Settings come from environment
variables; stdlib only, so a process that never calls the target never imports torch because of us.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

from decodegap.capture import output
from decodegap.capture.profiler import StepProfiler
from decodegap.capture.target import Target, parse_target, patch

ENV_TARGET = "DECODEGAP_RECORD_TARGET"
ENV_STEPS = "DECODEGAP_RECORD_STEPS"
ENV_WARMUP = "DECODEGAP_RECORD_WARMUP"
ENV_TIMED = "DECODEGAP_RECORD_TIMED_STEPS"
ENV_OUT = "DECODEGAP_RECORD_OUT"
ENV_SHAPES = "DECODEGAP_RECORD_SHAPES"
# Where processes leave `<pid>.called` / `<pid>.reported` marks, so that the record command can tell
# "never called anywhere" apart from "called, and the process already said what went wrong".
ENV_STATUS = "DECODEGAP_RECORD_STATUS_DIR"
# Where the decodegap package lives, for a program whose own Python environment lacks it.
ENV_PKG_ROOT = "DECODEGAP_RECORD_PKG_ROOT"

_installed: StepProfiler | None = None


def settings_env(
    target: str,
    *,
    steps: int,
    warmup: int,
    timed_steps: int,
    out_dir: str,
    record_shapes: bool,
    status_dir: str,
) -> dict[str, str]:
    return {
        ENV_TARGET: target,
        ENV_STEPS: str(steps),
        ENV_WARMUP: str(warmup),
        ENV_TIMED: str(timed_steps),
        ENV_OUT: out_dir,
        ENV_SHAPES: "1" if record_shapes else "0",
        ENV_STATUS: status_dir,
    }


def install_from_env() -> StepProfiler | None:
    """Install the hook described by the environment; no-op without DECODEGAP_RECORD_TARGET. Never raises."""
    global _installed
    spec = os.environ.get(ENV_TARGET)
    if not spec or _installed is not None:
        return _installed
    try:
        target = parse_target(spec)
        status_dir = os.environ.get(ENV_STATUS, "")
        profiler = StepProfiler(
            warmup=int(os.environ.get(ENV_WARMUP, "10")),
            steps=int(os.environ.get(ENV_STEPS, "10")),
            timed_steps=int(os.environ.get(ENV_TIMED, "10")),
            out_dir=os.environ.get(ENV_OUT, "decodegap-traces"),
            enabled=True,
            record_shapes=os.environ.get(ENV_SHAPES, "0") == "1",
            target=str(target),
            warn_if_unused=False,  # most processes of a server never call it; `record` reports that once
            on_event=(lambda event: _mark(status_dir, event)) if status_dir else None,
        )
    except Exception as exc:  # noqa: BLE001
        output.warn(f"record hook not installed ({type(exc).__name__}: {exc}); the program runs unprofiled")
        return None
    _installed = profiler
    module = sys.modules.get(target.module)
    if module is not None:
        _patch_or_warn(target, module, profiler)
    else:
        sys.meta_path.insert(0, _TargetFinder(target, profiler))
    return profiler


def _mark(status_dir: str, event: str) -> None:
    with open(os.path.join(status_dir, f"{os.getpid()}.{event}"), "w"):
        pass


def _patch_or_warn(target: Target, module: ModuleType, profiler: StepProfiler) -> None:
    try:
        patch(target, module, profiler.wrap)
    except Exception as exc:  # noqa: BLE001
        profiler.report(f"cannot wrap the target ({type(exc).__name__}: {exc})")


class _TargetFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the other finders for the target's module and hooks the loader, so
    that the target is wrapped right after the module body runs, before anyone else can import from it."""

    def __init__(self, target: Target, profiler: StepProfiler) -> None:
        self._target = target
        self._profiler = profiler

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._target.module:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, self._after_exec)
        return spec

    def _after_exec(self, module: ModuleType) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        _patch_or_warn(self._target, module, self._profiler)


class _HookedLoader(importlib.abc.Loader):
    """Delegates everything to the real loader; runs a callback after exec_module succeeds."""

    def __init__(self, loader: Any, after_exec: Any) -> None:
        self._loader = loader
        self._after_exec = after_exec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The real loader (and anything reading __loader__/__spec__.loader later) should be the original.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._after_exec(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, resource readers ...
        return getattr(self._loader, name)
