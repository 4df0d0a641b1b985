"""Profile a fixed window of decode steps: W warmup calls, K timed calls without the profiler, N profiled calls.

torch is imported only once a profiler is enabled and past its warmup; a disabled one touches nothing.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import signal
import socket
import threading
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

from decodegap.capture import output, timing
from decodegap.capture.timing import StepTimer, cuda_in_use

F = TypeVar("F", bound=Callable[..., Any])

ENV_ENABLE = "DECODEGAP_PROFILE"
METADATA_KEY = "decodegap_record"
METADATA_VERSION = 1
STEP_PREFIX = "ProfilerStep#"  # what `analyze` looks for, on the CPU and the GPU timeline

_NULL = nullcontext()
_PASS = ("pass",)  # token of a call we neither time nor profile


def enabled_from_env() -> bool:
    return os.environ.get(ENV_ENABLE, "") == "1"


# The first CUDA profiling session of a process lost the end of its window on an H200 (torch 2.11, CUDA 13): the
# demo at full geometry under CUDA graphs kept 4,541 of the last step's 7,437 kernels, every time, whatever the
# stop did (sleep, extra kernel); later sessions in the same process were complete, and so was a first session
# preceded by a short session that recorded as many kernels (benchmarks/graph_tail_check.py). So each process
# primes the profiler once, at its first window: ~25k tiny kernels, a fraction of a second.
PRIME_KERNELS = 25_000
_primed = False


def _prime_cuda_profiler(torch: Any, profile: Any, activities: list) -> None:
    global _primed
    if _primed:
        return
    _primed = True
    try:
        scratch = torch.zeros(1, device="cuda")
        with profile(activities=activities):
            for _ in range(PRIME_KERNELS):
                scratch.add_(1)
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - priming is best effort; the real window reports its own failures
        pass


class StepProfiler:
    """Profile one window of steps of a live program, then write one trace and get out of the way.

    Calls 1..W run untouched (warmup); the next K are timed without the profiler (CUDA events when
    the program uses CUDA, else the wall clock) and their median is stored in the trace metadata under
    `decodegap_record`; the next N run under torch.profiler, each inside a `ProfilerStep#<i>`
    annotation (i = 0..N-1) that spans exactly that call. Then the trace is written atomically to
    `<out_dir>/<host>.<pid>.rank-<rank>.decodegap.pt.trace.json.gz` and every later call is a plain call.

    Use it around a step (``with prof.step(): ...``), as a decorator (``prof.wrap(fn)`` or
    ``profile_steps``), or as a context manager whose exit reports an unfinished window.

    Cost per call, measured with benchmarks/bench_record_overhead.py (CPython 3.11, x86-64, a shared
    2-core VM, best of 7 x 200k calls; a bare call of a trivial function is ~41 ns there): disabled,
    `profile_steps` returns the function itself, so +0 ns (measured +0.7, noise); a disabled
    ``with prof.step():`` adds ~0.45 us; an enabled wrapper adds ~0.55 us per warmup call and
    ~0.15 us per call after its window. A decode step takes milliseconds: below 0.06% of one.

    Failures never reach the program: if the output folder is not writable, the profiler cannot
    start or the export fails, one `decodegap: warning:` line goes to stderr, the profiler is stopped
    and the program runs on unprofiled. A window left unfinished (the target was never called, or
    called fewer than W+K+N times) is reported in one line when the profiler is closed or at exit.
    Not thread-safe: the target must be called from one thread, as a decode loop is.
    """

    def __init__(
        self,
        *,
        warmup: int = 10,
        steps: int = 10,
        timed_steps: int = 10,
        out_dir: str = "decodegap-traces",
        enabled: bool | None = None,
        record_shapes: bool = False,
        target: str = "",
        warn_if_unused: bool = True,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        for name, value, least in (
            ("warmup", warmup, 0),
            ("steps", steps, 1),
            ("timed_steps", timed_steps, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        self.warmup, self.steps, self.timed_steps = warmup, steps, timed_steps
        self.out_dir = os.path.abspath(out_dir)  # absolute: the program may chdir before the window
        self.enabled = enabled_from_env() if enabled is None else bool(enabled)
        self.record_shapes = record_shapes
        self.target = target or "step"
        self.warn_if_unused = warn_if_unused
        self._on_event = on_event
        self._reset()
        if self.enabled:
            ref = weakref.ref(self)
            # A forked worker is a new process with its own window and its own trace.
            os.register_at_fork(after_in_child=lambda: (p := ref()) is not None and p._reset())
            atexit.register(_close_if_alive, ref)

    def _reset(self) -> None:
        self.done = not self.enabled  # the wrappers' fast path reads only this
        self.trace_path: str | None = None
        self._calls = 0
        self._depth = 0
        self._closed = False
        self._reported = False
        self._torch: Any = None
        self._timer: StepTimer | None = None
        self._prof: Any = None
        self._raised: list[dict[str, Any]] = []

    # -- public API ---------------------------------------------------------------------------------
    def step(self) -> Any:
        """Context manager around one step: ``with prof.step(): logits = model(x)``."""
        return _NULL if self.done else _StepContext(self)

    def wrap(self, fn: F) -> F:
        """Return fn wrapped so that each call is one step (methods too: the wrapper binds like fn)."""
        sp = self
        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if sp.done:
                    return await fn(*args, **kwargs)
                token = sp._begin()
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as exc:
                    sp._end(token, exc)
                    raise
                sp._end(token)
                return result

            wrapper: Any = async_wrapper
        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if sp.done:
                    return fn(*args, **kwargs)
                token = sp._begin()
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    sp._end(token, exc)
                    raise
                sp._end(token)
                return result

        functools.update_wrapper(wrapper, fn)
        wrapper.__decodegap_profiler__ = sp
        return wrapper

    def close(self) -> None:
        """Stop a running profiler and say, in one line, why no trace was written (if none was)."""
        if self._closed or not self.enabled:
            return
        self._closed = True
        if self.trace_path is not None or self._reported:  # finished, or failed and said so
            return
        self.done = True
        self._stop_quietly()
        needed = self.warmup + self.timed_steps + self.steps
        if self._calls == 0:
            if self.warn_if_unused:
                self._warn(f"{self.target}: never called; no trace written")
        else:
            self._warn(
                f"{self.target}: called {self._calls} times, fewer than warmup {self.warmup} + timed "
                f"{self.timed_steps} + steps {self.steps} = {needed}; no trace written"
            )

    def __enter__(self) -> StepProfiler:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the window -----------------------------------------------------------------------------------
    def _begin(self) -> tuple[Any, ...]:
        if self._depth:  # the target called itself: the inner call is part of the outer step
            self._depth += 1
            return _PASS
        self._depth = 1
        index = self._calls
        self._calls += 1
        try:
            if index == 0:
                self._first_call()
            if self.done or index < self.warmup:
                return _PASS
            torch = self._import_torch()
            if self._capturing_cuda_graph(torch):  # a graph capture is not a step; don't count it
                self._calls -= 1
                return _PASS
            if index < self.warmup + self.timed_steps:
                if self._timer is None:
                    self._timer = StepTimer(torch)
                return ("timed", self._timer.begin(), index)
            step = index - self.warmup - self.timed_steps
            if step == 0:
                self._start_profiler(torch)
                if self.done:
                    return _PASS
                self._event("profiling")
            annotation = torch.profiler.record_function(f"{STEP_PREFIX}{step}")
            annotation.__enter__()
            return ("profiled", annotation, step, index)
        except Exception as exc:  # noqa: BLE001 - never let the profiler break the step
            self._fail(f"profiling failed ({type(exc).__name__}: {exc})")
            return _PASS

    def _end(self, token: tuple[Any, ...], exc: BaseException | None = None) -> None:
        self._depth -= 1
        if token is _PASS or self._depth:
            return
        try:
            if exc is not None:
                self._note_raised(token, exc)
            if token[0] == "timed":
                assert self._timer is not None
                self._timer.end(token[1], token[2])
            else:
                token[1].__exit__(None, None, None)
                if token[2] == self.steps - 1:
                    self._finish()
        except Exception as exc:  # noqa: BLE001
            self._fail(f"profiling failed ({type(exc).__name__}: {exc})")

    def _note_raised(self, token: tuple[Any, ...], exc: BaseException) -> None:
        kind = type(exc)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        phase = token[0]
        self._raised.append(
            {
                "call_index": token[2] if phase == "timed" else token[3],
                "phase": phase,
                "step": token[2] if phase == "profiled" else None,
                "exception": name,
            }
        )

    def _first_call(self) -> None:
        self._event("called")
        why = output.check_writable(self.out_dir)
        if why is not None:
            self._fail(f"cannot write traces: {why}")

    def _import_torch(self) -> Any:
        if self._torch is None:
            import torch
            import torch.profiler

            self._torch = torch
        return self._torch

    @staticmethod
    def _capturing_cuda_graph(torch: Any) -> bool:
        return cuda_in_use(torch) and bool(torch.cuda.is_current_stream_capturing())

    def _start_profiler(self, torch: Any) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if cuda_in_use(torch):
            activities.append(ProfilerActivity.CUDA)
            _prime_cuda_profiler(torch, profile, activities)
        try:
            prof = profile(activities=activities, record_shapes=self.record_shapes)
            self._prof = prof
            prof.start()
        except Exception as exc:  # noqa: BLE001
            self._fail(f"the profiler could not start ({type(exc).__name__}: {exc})")

    def _finish(self) -> None:
        """Close the window: stop the profiler, write the trace. Runs inside the last profiled call."""
        torch, prof = self._torch, self._prof
        self.done = True
        if cuda_in_use(torch):
            torch.cuda.synchronize()  # every kernel of the window must be complete before the stop
        rank, world_size = output.detect_rank()
        metadata = self._metadata(rank, world_size)
        prof.add_metadata_json(METADATA_KEY, json.dumps(metadata))
        prof.stop()
        self._prof = None
        final = output.trace_path(self.out_dir, rank)
        self._event("exporting")
        tmp_json = None
        try:
            with _ExportGuard(on_default_term=self._abandon_export):
                tmp_json = output.temp_json_path(self.out_dir)
                prof.export_chrome_trace(tmp_json)
                if not output.json_looks_complete(tmp_json):
                    raise OSError("the exporter stopped before the end of the trace (disk full?)")
                output.publish_gzip(tmp_json, final)
        except Exception as exc:  # noqa: BLE001
            self._fail(f"exporting the trace failed ({type(exc).__name__}: {exc})")
            return
        except BaseException as exc:  # the program's SIGTERM handler exited, or a KeyboardInterrupt: let it go on
            if not self._reported:
                self._warn(
                    f"{self.target}: writing the trace was interrupted ({type(exc).__name__}); "
                    "its partial files were removed, no trace written"
                )
            raise
        finally:
            if tmp_json is not None:
                output.remove_with_siblings(tmp_json)  # the exporter's own temp file too
        self.trace_path = final
        self._event("written", json.dumps(metadata))

    def _abandon_export(self) -> None:
        output.remove_own_partials(self.out_dir)
        self._warn(f"{self.target}: SIGTERM while writing the trace; its partial files were removed, no trace written")

    def _metadata(self, rank: int | None, world_size: int | None) -> dict[str, Any]:
        timed = (
            self._timer.result()
            if self._timer is not None
            else timing.summary([], [], "cuda_events" if cuda_in_use(self._torch) else "wall")
        )
        return {
            "version": METADATA_VERSION,
            "target": self.target,
            "warmup": self.warmup,
            "steps": self.steps,
            "timed_steps": self.timed_steps,
            "unprofiled_step_ms": timed,
            "rank": rank,
            "world_size": world_size,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "record_shapes": self.record_shapes,
            "raised": list(self._raised),
        }

    def report(self, message: str) -> None:
        """Give up for good, with one warning line (the first reason only); the program goes on."""
        self._stop_quietly()
        self.done = True
        if not self._reported:
            self._warn(f"{self.target}: {message}; the program continues without profiling")

    _fail = report

    def _warn(self, message: str) -> None:
        self._reported = True
        output.warn(message)
        self._event("reported")

    def _event(self, name: str, payload: str = "") -> None:
        if self._on_event is not None:
            try:
                self._on_event(name, payload)
            except Exception:  # noqa: BLE001, S110 - bookkeeping only
                pass

    def _stop_quietly(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.stop()
            except Exception:  # noqa: BLE001, S110 - it may never have started
                pass


class _ExportGuard:
    """Around the export: a SIGTERM whose action is the default (die) first removes the half-written files, then
    the process dies of it as it would have. A handler of the program's own is called as it would have been; if
    it raises (sys.exit), the export's `finally` removes the files; if it returns, the export goes on. An ignored
    SIGTERM, a handler set outside Python, or an export outside the main thread: nothing is installed (`record`
    removes what a dead process left)."""

    def __init__(self, on_default_term: Callable[[], None]) -> None:
        self._on_default_term = on_default_term
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _ExportGuard:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            previous = signal.getsignal(signal.SIGTERM)
            if previous is None or previous == signal.SIG_IGN:
                return self
            signal.signal(signal.SIGTERM, self._handle)
        except (ValueError, OSError):
            return self
        self._previous, self._installed = previous, True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            self._installed = False
            try:
                signal.signal(signal.SIGTERM, self._previous)
            except (ValueError, OSError):
                pass

    def _handle(self, signum: int, frame: Any) -> Any:
        previous = self._previous
        if callable(previous):
            return previous(signum, frame)
        self._on_default_term()
        self.__exit__()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None


class _StepContext:
    __slots__ = ("_sp", "_token")

    def __init__(self, sp: StepProfiler) -> None:
        self._sp = sp

    def __enter__(self) -> None:
        self._token = self._sp._begin()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._sp._end(self._token, exc)


def _close_if_alive(ref: weakref.ref[StepProfiler]) -> None:
    sp = ref()
    if sp is not None:
        sp.close()


def profile_steps(
    fn: F | None = None,
    *,
    warmup: int = 10,
    steps: int = 10,
    timed_steps: int = 10,
    out_dir: str = "decodegap-traces",
    enabled: bool | None = None,
    record_shapes: bool = False,
) -> Any:
    """Decorator: profile a window of calls of a step function (see StepProfiler).

    ``@profile_steps`` or ``@profile_steps(warmup=20, steps=30, out_dir="traces")``. Whether it is
    enabled is decided when it decorates (`enabled`, else `DECODEGAP_PROFILE=1`); disabled, it returns
    the function itself, so the cost is zero. The profiler is reachable as `fn.__decodegap_profiler__`.
    """

    def decorate(func: F) -> F:
        sp = StepProfiler(
            warmup=warmup,
            steps=steps,
            timed_steps=timed_steps,
            out_dir=out_dir,
            enabled=enabled,
            record_shapes=record_shapes,
            target=f"{func.__module__}:{func.__qualname__}",
        )
        return sp.wrap(func) if sp.enabled else func

    return decorate(fn) if fn is not None else decorate


__all__ = ["ENV_ENABLE", "METADATA_KEY", "STEP_PREFIX", "StepProfiler", "enabled_from_env", "profile_steps"]
