"""Wrap the record target in this process, now or when its module finishes importing.

Runs from the sitecustomize that `decodegap record` puts first on PYTHONPATH, so in every Python process
of the recorded program (spawned, forked or started as a subprocess). Settings come from environment
variables; stdlib only, so a process that never calls the target never imports torch because of us.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from decodegap.capture import main_script, output
from decodegap.capture.profiler import StepProfiler
from decodegap.capture.target import Target, did_you_mean, parse_target, patch

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
            on_event=(lambda event, payload: _mark(status_dir, event, payload)) if status_dir else None,
        )
    except Exception as exc:  # noqa: BLE001
        output.warn(f"record hook not installed ({type(exc).__name__}: {exc}); the program runs unprofiled")
        return None
    _installed = profiler
    try:
        _wrap_everywhere(target, profiler, status_dir)
    except Exception as exc:  # noqa: BLE001
        output.warn(f"record hook not installed ({type(exc).__name__}: {exc}); the program runs unprofiled")
    return profiler


def _wrap_everywhere(target: Target, profiler: StepProfiler, status_dir: str) -> None:
    """Wrap the target now if its module is loaded, else when it is imported, run as the main script (this
    process) or re-run as `__mp_main__` (a multiprocessing child); at exit, say why it never was."""
    state = _WrapState(target, profiler, status_dir)
    module = sys.modules.get(target.module)
    if module is not None:
        state.patch(module)
        return
    hooks = {target.module: state.patch}
    spawn = sys.modules.get("multiprocessing.spawn")
    if spawn is not None:
        main_script.wrap_spawn_fixups(spawn, target, state.patch)
    else:
        hooks["multiprocessing.spawn"] = lambda m: main_script.wrap_spawn_fixups(m, target, state.patch)
    sys.meta_path.insert(0, _AfterImport(hooks))
    argv = getattr(sys, "argv", None) or []
    names, label = main_script.startup_main(argv, getattr(sys, "orig_argv", argv), sys.path)
    if target.module in names:
        watch = main_script.ScriptWatch(
            target, lambda m: main_script.patch_main(target, m, state.patch), state.note, script=label
        )
        watch.install()
    atexit.register(state.at_exit)


def _mark(status_dir: str, event: str, payload: str = "") -> None:
    with open(os.path.join(status_dir, f"{os.getpid()}.{event}"), "w", encoding="utf-8") as f:
        f.write(payload)


class _WrapState:
    """What this process did about the target, told to `record` through marks in the status folder."""

    def __init__(self, target: Target, profiler: StepProfiler, status_dir: str) -> None:
        self.target, self.profiler, self.status_dir = target, profiler, status_dir
        self.wrapped = False
        self.noted = False

    def patch(self, module: ModuleType) -> None:
        try:
            patch(self.target, module, self.profiler.wrap)
        except Exception as exc:  # noqa: BLE001
            self.profiler.report(f"cannot wrap the target ({type(exc).__name__}: {exc})")
            return
        if not self.wrapped:
            self.wrapped = True
            self._mark("wrapped")

    def note(self, why: str) -> None:
        self.noted = True
        self._mark("unresolved", why)

    def at_exit(self) -> None:
        """A process where the target's module was never loaded: leave the closest loaded name, for a typo."""
        if self.wrapped or self.noted or self.target.module in sys.modules:
            return
        self._mark("no-module", did_you_mean(self.target.module, list(sys.modules)))

    def _mark(self, event: str, payload: str = "") -> None:
        if self.status_dir:
            try:
                _mark(self.status_dir, event, payload)
            except Exception:  # noqa: BLE001, S110 - bookkeeping only
                pass


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules it watches, it asks the other finders and hooks the loader, so that
    a callback runs right after the module body, before anyone else can import from it."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self._hooks = dict(hooks)

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._hooks:
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
            spec.loader = _HookedLoader(spec.loader, lambda module: self._after_exec(fullname, module))
        return spec

    def _after_exec(self, fullname: str, module: ModuleType) -> None:
        hook = self._hooks.pop(fullname, None)
        if not self._hooks:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        if hook is not None:
            try:
                hook(module)
            except Exception as exc:  # noqa: BLE001 - the program's import must succeed whatever we do
                output.warn(f"record hook failed on {fullname} ({type(exc).__name__}: {exc})")


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
