"""StepProfiler and profile_steps in-process: the window, the metadata, the disabled path, failure isolation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _record_helpers import TRACE_GLOB, all_files, load_trace, step_names, warning_lines  # noqa: E402

from decodegap.capture import StepProfiler, profile_steps  # noqa: E402
from decodegap.capture.target import parse_target, patch  # noqa: E402

W, K, N = 2, 3, 4


def _step(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ x)


def _run(fn, calls: int) -> list[float]:
    x = torch.eye(8) * 0.5
    return [float(fn(x).sum()) for _ in range(calls)]


def test_window_writes_exactly_n_steps_and_metadata(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    sp = StepProfiler(
        warmup=W, steps=N, timed_steps=K, out_dir=str(tmp_path), enabled=True, target="toy:step"
    )
    wrapped = sp.wrap(_step)
    assert _run(wrapped, W + K + N + 3) == _run(_step, W + K + N + 3)
    sp.close()
    traces = list(tmp_path.glob(TRACE_GLOB))
    assert [p.name for p in traces] == [os.path.basename(sp.trace_path or "")]
    assert traces[0].name.endswith(f".{os.getpid()}.rank-0.decodegap.pt.trace.json.gz")
    trace = load_trace(traces[0])
    assert step_names(trace) == [f"ProfilerStep#{i}" for i in range(N)]
    meta = trace["decodegap_record"]
    assert {k: meta[k] for k in ("version", "target", "warmup", "steps", "timed_steps", "pid")} == {
        "version": 1,
        "target": "toy:step",
        "warmup": W,
        "steps": N,
        "timed_steps": K,
        "pid": os.getpid(),
    }
    timed = meta["unprofiled_step_ms"]
    # CUDA events once the process uses CUDA (other tests on a GPU machine initialize it), else the wall clock
    import torch

    from decodegap.capture.timing import cuda_in_use

    assert timed["clock"] == ("cuda_events" if cuda_in_use(torch) else "wall")
    assert len(timed["samples"]) == K and timed["median"] > 0
    assert all_files(tmp_path) == [traces[0].name]  # no temp file left behind
    assert warning_lines(capfd.readouterr().err) == []


def test_step_context_and_rank_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with StepProfiler(warmup=0, steps=2, timed_steps=0, out_dir=str(tmp_path), enabled=True) as sp:
        for _ in range(3):
            with sp.step():
                _step(torch.ones(4, 4))
    (trace_file,) = tmp_path.glob(TRACE_GLOB)
    assert ".rank-3." in trace_file.name
    meta = load_trace(trace_file)["decodegap_record"]
    assert (meta["rank"], meta["world_size"], meta["unprofiled_step_ms"]["median"]) == (3, 8, None)


def test_disabled_is_the_function_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DECODEGAP_PROFILE", raising=False)
    assert profile_steps(_step, out_dir=str(tmp_path)) is _step
    sp = StepProfiler(out_dir=str(tmp_path))
    assert not sp.enabled and sp.step() is sp.step()  # one shared null context, no allocation
    monkeypatch.setenv("DECODEGAP_PROFILE", "1")
    wrapped = profile_steps(warmup=0, steps=1, out_dir=str(tmp_path))(_step)
    assert wrapped is not _step and wrapped.__wrapped__ is _step
    wrapped.__decodegap_profiler__.close()  # never called: one line now rather than at interpreter exit


def test_exceptions_and_recursion_pass_through(tmp_path: Path) -> None:
    sp = StepProfiler(warmup=1, steps=2, timed_steps=1, out_dir=str(tmp_path), enabled=True)

    @sp.wrap
    def step(n: int) -> int:
        if n < 0:
            raise ValueError("boom")
        return step(n - 1) + 1 if n else 0  # nested calls belong to the outer step

    assert step(3) == 3
    with pytest.raises(ValueError, match="boom"):
        step(-1)
    assert [step(2) for _ in range(3)] == [2, 2, 2]
    (trace_file,) = tmp_path.glob(TRACE_GLOB)
    assert step_names(load_trace(trace_file)) == ["ProfilerStep#0", "ProfilerStep#1"]


# -- failure isolation: the program's results are unchanged, one warning line, no file under a final name --


def _assert_isolated(sp: StepProfiler, folder: Path, capfd: pytest.CaptureFixture[str], why: str) -> None:
    wrapped = sp.wrap(_step)
    assert _run(wrapped, W + K + N + 2) == _run(_step, W + K + N + 2)
    sp.close()
    warnings = warning_lines(capfd.readouterr().err)
    assert len(warnings) == 1 and why in warnings[0], warnings
    assert list(folder.glob(TRACE_GLOB)) == [] and sp.trace_path is None
    assert [f for f in all_files(folder) if "partial" in f or f.endswith(".gz")] == []


def test_profiler_start_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    def broken_start(self) -> None:
        raise RuntimeError("another profiler is already running")

    monkeypatch.setattr(torch.profiler.profile, "start", broken_start)
    sp = StepProfiler(warmup=W, steps=N, timed_steps=K, out_dir=str(tmp_path), enabled=True)
    _assert_isolated(sp, tmp_path, capfd, "could not start")


def test_export_fails_midway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    def broken_export(self, path: str, *args, **kwargs) -> None:
        Path(path).write_text('{"traceEvents": [')  # half a trace, then the disk is full
        Path(path + ".tmp").write_text("x" * 1000)  # and the exporter's own temp file beside it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", broken_export)
    sp = StepProfiler(warmup=W, steps=N, timed_steps=K, out_dir=str(tmp_path), enabled=True)
    _assert_isolated(sp, tmp_path, capfd, "exporting the trace failed")
    assert all_files(tmp_path) == []


def test_export_stops_short_without_raising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    # A writer that hits a full disk may return as if all went well: the cut JSON must not become a trace.
    def short_export(self, path: str, *args, **kwargs) -> None:
        Path(path).write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a"}, {"ph"')

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", short_export)
    sp = StepProfiler(warmup=W, steps=N, timed_steps=K, out_dir=str(tmp_path), enabled=True)
    _assert_isolated(sp, tmp_path, capfd, "stopped before the end of the trace")
    assert all_files(tmp_path) == []


def test_output_folder_not_writable(tmp_path: Path, capfd) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    sp = StepProfiler(warmup=W, steps=N, timed_steps=K, out_dir=str(blocker / "traces"), enabled=True)
    _assert_isolated(sp, tmp_path, capfd, "cannot write traces")


def test_target_never_called(tmp_path: Path, capfd) -> None:
    sp = StepProfiler(warmup=W, steps=N, timed_steps=K, out_dir=str(tmp_path), enabled=True, target="t:f")
    sp.wrap(_step)
    sp.close()
    sp.close()  # and atexit's close: still one line
    warnings = warning_lines(capfd.readouterr().err)
    assert warnings == ["decodegap: warning: t:f: never called; no trace written"]
    assert all_files(tmp_path) == []


def test_window_not_completed(tmp_path: Path, capfd) -> None:
    sp = StepProfiler(warmup=W, steps=N, timed_steps=K, out_dir=str(tmp_path), enabled=True)
    _run(sp.wrap(_step), W + K + 1)  # the profiler is running when the program stops calling
    sp.close()
    warnings = warning_lines(capfd.readouterr().err)
    assert len(warnings) == 1 and "called 6 times, fewer than" in warnings[0]
    assert all_files(tmp_path) == []


# -- targets --------------------------------------------------------------------------------------------


def test_parse_target() -> None:
    t = parse_target("pkg.mod:Class.method")
    assert (t.module, t.attrs, str(t)) == ("pkg.mod", ("Class", "method"), "pkg.mod:Class.method")
    for bad in ("pkg.mod", "pkg.mod:", ":f", "pkg mod:f", "pkg.mod:Class.", "a:b:c"):
        with pytest.raises(ValueError, match="bad target"):
            parse_target(bad)


def test_patch_methods_static_class_and_functions() -> None:
    import types

    class Base:
        def forward(self, x: int) -> int:
            return x + 1

    class Runner(Base):
        @staticmethod
        def s(x: int) -> int:
            return x * 2

        @classmethod
        def c(cls, x: int) -> str:
            return f"{cls.__name__}{x}"

    module = types.ModuleType("toymod")
    module.Runner, module.f = Runner, lambda x: -x
    calls: list[str] = []

    def wrap(fn):
        def wrapper(*a, **k):
            calls.append(fn.__name__)
            return fn(*a, **k)

        wrapper.__decodegap_profiler__ = True
        return wrapper

    for spec in ("toymod:Runner.forward", "toymod:Runner.s", "toymod:Runner.c", "toymod:f", "toymod:f"):
        patch(parse_target(spec), module, wrap)
    r = Runner()
    assert (r.forward(1), Runner.s(2), r.c(3), module.f(4), Base().forward(1)) == (2, 4, "Runner3", -4, 2)
    assert calls == ["forward", "s", "c", "<lambda>"]  # patched once, Base itself untouched
    with pytest.raises(AttributeError):
        patch(parse_target("toymod:Runner.missing"), module, wrap)


# -- what the metadata says about the steps -------------------------------------------------------------


def test_steps_that_raised_are_named_in_the_metadata(tmp_path: Path) -> None:
    sp = StepProfiler(warmup=1, steps=3, timed_steps=2, out_dir=str(tmp_path), enabled=True)

    @sp.wrap
    def step(call: int) -> int:
        if call in (2, 4):  # the second timed call and the second profiled step
            raise KeyError(call)
        return call

    for call in range(7):
        try:
            step(call)
        except KeyError:
            pass
    (trace_file,) = tmp_path.glob(TRACE_GLOB)
    trace = load_trace(trace_file)
    assert step_names(trace) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert trace["decodegap_record"]["raised"] == [
        {"call_index": 2, "phase": "timed", "step": None, "exception": "KeyError"},
        {"call_index": 4, "phase": "profiled", "step": 1, "exception": "KeyError"},
    ]


def test_step_context_marks_a_raise_too(tmp_path: Path) -> None:
    class DecodeError(RuntimeError):
        pass

    with StepProfiler(warmup=0, steps=2, timed_steps=0, out_dir=str(tmp_path), enabled=True) as sp:
        for call in range(2):
            with pytest.raises(DecodeError), sp.step():
                raise DecodeError(f"bad token in call {call}")
    (trace_file,) = tmp_path.glob(TRACE_GLOB)
    raised = load_trace(trace_file)["decodegap_record"]["raised"]
    assert [(r["step"], r["exception"]) for r in raised] == [
        (0, f"{__name__}.test_step_context_marks_a_raise_too.<locals>.DecodeError"),
        (1, f"{__name__}.test_step_context_marks_a_raise_too.<locals>.DecodeError"),
    ]


def test_unprofiled_samples_of_two_kinds_are_bimodal(tmp_path: Path) -> None:
    import time

    warmup, timed = 2, 10
    sp = StepProfiler(warmup=warmup, steps=2, timed_steps=timed, out_dir=str(tmp_path), enabled=True)

    @sp.wrap
    def step(call: int) -> None:
        # a short prompt's decode steps, then a long prompt's, inside the timed window
        time.sleep(0.002 if call < warmup + 6 else 0.025)

    for call in range(warmup + timed + 2):
        step(call)
    (trace_file,) = tmp_path.glob(TRACE_GLOB)
    timed_ms = load_trace(trace_file)["decodegap_record"]["unprofiled_step_ms"]
    assert timed_ms["call_index"] == list(range(warmup, warmup + timed))
    assert len(timed_ms["samples"]) == timed
    assert timed_ms["bimodal"] is True
    assert [m["count"] for m in timed_ms["modes"]] == [6, 4]
    low, high = (m["median"] for m in timed_ms["modes"])
    assert 1.5 < low < 15 < 24 < high  # sleep() takes at least its time; a loaded machine adds to both
    assert timed_ms["p10"] <= timed_ms["median"] <= timed_ms["p90"]
