"""A target `pkg.module:Class.method` (or `pkg.module:function`): parse it, and wrap it in place."""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_TARGET_RE = re.compile(rf"^({_DOTTED}):({_DOTTED})$")

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Target:
    module: str
    attrs: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.module}:{'.'.join(self.attrs)}"


def parse_target(text: str) -> Target:
    match = _TARGET_RE.match(text.strip())
    if match is None:
        raise ValueError(
            f"bad target {text!r}: expected 'package.module:function' or 'package.module:Class.method'"
        )
    return Target(match.group(1), tuple(match.group(2).split(".")))


def did_you_mean(name: str, candidates: Any) -> str:
    """` (did you mean 'x'?)` for the closest of candidates, or '' when none is close."""
    names = [c for c in candidates if isinstance(c, str)]
    match = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _describe(owner: Any) -> str:
    if isinstance(owner, ModuleType):
        if owner.__name__ in ("__main__", "__mp_main__") and getattr(owner, "__file__", None):
            return f"the main script {owner.__file__}"
        return f"module {owner.__name__!r}"
    if isinstance(owner, type):
        return f"class {owner.__qualname__}"
    return f"{type(owner).__name__} object"


def _lookup(owner: Any, name: str) -> Any:
    # Our own message, not Python's: for a module still initializing (we wrap from inside its import) Python
    # blames "a circular import", which is never the problem when a name is misspelt.
    try:
        return getattr(owner, name)
    except AttributeError:
        pass
    raise AttributeError(f"{_describe(owner)} has no attribute {name!r}{did_you_mean(name, dir(owner))}") from None


def is_wrapped(obj: Any) -> bool:
    return getattr(obj, "__decodegap_profiler__", None) is not None


def patch(target: Target, module: ModuleType, wrap: Wrap) -> None:
    """Replace the target attribute with wrap(original). Raises AttributeError/TypeError on a bad target.

    A method is replaced on the named class (found through its MRO, set on the class itself), so every
    instance, existing or future, and every subclass that does not override it, goes through the wrapper.
    """
    owner: Any = module
    for name in target.attrs[:-1]:
        owner = _lookup(owner, name)
    name = target.attrs[-1]
    if isinstance(owner, type):
        raw = next((klass.__dict__[name] for klass in owner.__mro__ if name in klass.__dict__), None)
        if raw is None:
            raise AttributeError(f"{_describe(owner)} has no attribute {name!r}{did_you_mean(name, dir(owner))}")
        if isinstance(raw, (staticmethod, classmethod)):
            if is_wrapped(raw.__func__):
                return
            setattr(owner, name, type(raw)(wrap(raw.__func__)))
            return
        if not inspect.isfunction(raw):
            # A plain wrapper function would bind `self` where the original (a builtin, a callable
            # object) may not: refuse rather than change how the program calls it.
            raise TypeError(f"{target} is a {type(raw).__name__}, not a function or method")
    else:
        raw = _lookup(owner, name)
        if not callable(raw):
            raise TypeError(f"{target} is a {type(raw).__name__}, not callable")
    if not is_wrapped(raw):
        setattr(owner, name, wrap(raw))
