"""A target whose module is the program's main script.

`python toy_decode.py` and `python -m toy_decode` run the module as `__main__`, and a `spawn` (or forkserver)
child re-runs it as `__mp_main__`: `import toy_decode` never happens, so the import hook never sees it.

- In the process started on the script, a trace function watches the script's top-level frame only and wraps
  the target at the first line after its name exists (a name the script's top-level code never stores stops the
  watch at once). It is removed as soon as the target is wrapped or the top-level code ends, so the profiled
  window never runs under it.
- In a `spawn` or forkserver child, `multiprocessing.spawn`'s `_fixup_main_from_path` / `_fixup_main_from_name`
  re-run the script; the target is wrapped right after they return, before the child unpickles its work.
- A `fork` child inherits the wrapped target.
Stdlib only.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Sequence
from types import CodeType, FrameType, ModuleType
from typing import Any

from decodegap.capture.target import Target, did_you_mean

MP_MAIN = "__mp_main__"


def names_of_script(path: str, search_path: Sequence[str]) -> set[str]:
    """The module names a script file can be imported as: its stem, and its dotted path under sys.path entries."""
    real = os.path.realpath(path)
    stem = os.path.splitext(os.path.basename(real))[0]
    names = {stem} if stem.isidentifier() else set()
    for entry in search_path:
        root = os.path.realpath(entry or os.curdir)
        if not real.startswith(root.rstrip(os.sep) + os.sep):
            continue
        parts = os.path.splitext(os.path.relpath(real, root))[0].split(os.sep)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(p.isidentifier() for p in parts):
            names.add(".".join(parts))
    return names


def names_of_module_run(name: str) -> set[str]:
    # `python -m pkg` runs pkg/__main__.py, whose spec is named `pkg.__main__`.
    return {name, f"{name}.__main__"}


def startup_main(argv: Sequence[str], orig_argv: Sequence[str], search_path: Sequence[str]) -> tuple[set[str], str]:
    """(module names, label) of what this process is about to run as `__main__`, read at start-up (sitecustomize
    time, when sys.argv[0] is the script's path, or "-m" with the name in sys.orig_argv)."""
    if not argv or not argv[0] or argv[0] == "-c":
        return set(), ""
    if argv[0] == "-m":
        # orig_argv is [python, *options, "-m", NAME, *argv[1:]] (or "-mNAME"): NAME sits before argv[1:].
        at = len(orig_argv) - len(argv)
        if at < 1:
            return set(), ""
        word = orig_argv[at]
        name = word[2:] if word.startswith("-m") and word != "-m" else word
        return (names_of_module_run(name), f"-m {name}") if name else (set(), "")
    return names_of_script(argv[0], search_path), argv[0]


def namespace_names(namespace: dict[str, Any], search_path: Sequence[str]) -> set[str]:
    """Module names of an executed main module, from its `__spec__` (-m) and `__file__` (a script path)."""
    names: set[str] = set()
    spec = namespace.get("__spec__")
    if spec is not None and isinstance(getattr(spec, "name", None), str):
        names |= names_of_module_run(spec.name)
    path = namespace.get("__file__")
    if isinstance(path, str):
        names |= names_of_script(path, search_path)
    return names


def patch_main(target: Target, module: ModuleType, patch: Callable[[ModuleType], None]) -> None:
    """Wrap the target in a main module; for a function, also where the script's own functions look it up.

    A spawn child's `__mp_main__` is a copy of the namespace runpy ran the script in: the script's functions
    still read their globals from that first namespace.
    """
    name = target.attrs[0]
    before = module.__dict__.get(name)
    patch(module)
    if len(target.attrs) == 1 and inspect.isfunction(before):
        home = before.__globals__
        if home is not module.__dict__ and home.get(name) is before:
            home[name] = module.__dict__[name]


def _stores_name(code: CodeType, name: str) -> bool:
    # Top-level code binds a name through co_names (def, class, import, assignment); a name absent from it can only
    # appear through exec or globals(), which we do not wait for.
    return name in code.co_names


class ScriptWatch:
    """The trace function that wraps a target defined in the main script of this process (see module doc)."""

    def __init__(
        self,
        target: Target,
        patch: Callable[[ModuleType], None],
        note: Callable[[str], None],
        script: str,  # how the process names its main script: "serve.py", "-m pkg.serve"
    ) -> None:
        self._target = target
        self._patch = patch
        self._note = note  # why the target was not wrapped, for record's summary
        self._script = script
        self._main_frame: FrameType | None = None
        self.active = False

    def install(self) -> bool:
        if sys.gettrace() is not None:  # a debugger or coverage owns tracing: leave it alone
            self._note(f"the main script {self._script} could not be watched (a trace function is already set)")
            return False
        self.active = True
        sys.settrace(self._on_call)
        return True

    def stop(self) -> None:
        if self.active:
            self.active = False
            if sys.gettrace() == self._on_call:  # a debugger that took over tracing since keeps it
                sys.settrace(None)
            if self._main_frame is not None:
                self._main_frame.f_trace = None
                self._main_frame = None

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self._main_frame is not None or frame.f_code.co_name != "<module>":
            return None
        main = sys.modules.get("__main__")
        if main is None or frame.f_globals is not main.__dict__:
            return None
        self._main_frame = frame
        name = self._target.attrs[0]
        if not _stores_name(frame.f_code, name):
            self.stop()
            hint = did_you_mean(name, frame.f_code.co_names)
            self._note(f"the main script {self._script} never defines {name!r}{hint}")
            return None
        return self._on_line

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self.active:
            return None
        if event == "return":
            missing = self._target.attrs[0] not in frame.f_globals
            self.stop()
            if missing:
                name = self._target.attrs[0]
                hint = did_you_mean(name, list(frame.f_globals))
                self._note(f"the main script {self._script} never defined {name!r}{hint}")
            return None
        if event == "line" and self._target.attrs[0] in frame.f_globals:
            self.stop()
            main = sys.modules.get("__main__")
            if main is not None:
                self._patch(main)
            return None
        return self._on_line


def wrap_spawn_fixups(spawn: ModuleType, target: Target, patch: Callable[[ModuleType], None]) -> None:
    """Wrap the target in `__mp_main__` right after multiprocessing re-runs the main script in a child."""
    for attr in ("_fixup_main_from_path", "_fixup_main_from_name"):
        original = getattr(spawn, attr, None)
        if original is None or getattr(original, "__decodegap_fixup__", False):
            continue
        setattr(spawn, attr, _after_fixup(original, target, patch))


def _after_fixup(original: Callable[..., Any], target: Target, patch: Callable[[ModuleType], None]) -> Any:
    def fixup(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        module = sys.modules.get(MP_MAIN) or sys.modules.get("__main__")
        if module is not None and target.module in namespace_names(module.__dict__, sys.path):
            patch_main(target, module, patch)
        return result

    fixup.__decodegap_fixup__ = True  # type: ignore[attr-defined]
    return fixup
