"""`decodegap record` edge cases, end to end in subprocesses: a target in the main script, a process killed while
its trace is written, misspelt targets, and the console summary of the unprofiled timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _record_helpers import TRACE_GLOB, all_files, load_trace, step_names, warning_lines

from decodegap.commands.record import NO_TRACE_EXIT

pytestmark = pytest.mark.slow  # subprocesses; a few seconds each

RUN_CLI = (
    "import decodegap.cli as c; c.COMMAND_MODULES.setdefault('record', 'decodegap.commands.record'); c.main()"
)
W, K, N = 2, 2, 3

# The program: the target lives in the script itself, which runs as __main__ in the parent and as
# __mp_main__ in a spawn child; both processes call it 40 times.
TOY_DECODE = """
import multiprocessing as mp
import sys
import torch

class ToyRunner:
    def __init__(self):
        self.w = torch.eye(16) * 0.9

    def forward_decode(self, x):
        return torch.tanh(x @ self.w)

def decode_step(runner, x):
    return runner.forward_decode(x)

def decode(n):
    r, x = ToyRunner(), torch.ones(1, 16)
    for _ in range(n):
        x = decode_step(r, x)
    return round(float(x.sum()), 4)

def worker(n, q):
    q.put(decode(n))

if __name__ == "__main__":
    n, method = int(sys.argv[1]), sys.argv[2]
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=worker, args=(n, q))
    p.start()
    print("main", decode(n))
    print("worker", q.get())
    p.join()
    sys.exit(p.exitcode)
"""

TOY_MODEL = """
import torch

class Runner:
    def __init__(self):
        self.w = torch.eye(16) * 0.9

    def decode_step(self, x):
        return torch.tanh(x @ self.w)

def decode(n):
    r, x = Runner(), torch.ones(1, 16)
    for _ in range(n):
        x = r.decode_step(x)
    return round(float(x.sum()), 4)
"""

# Kills the export half-way in the process named by KILL_WHERE ("main" or "child"), with the signal KILL_WITH,
# after writing what a real exporter leaves: part of the JSON, and a file of its own beside it.
SABOTAGE = """
import multiprocessing, os, signal
import torch.profiler

_real_export = torch.profiler.profile.export_chrome_trace

def _export(self, path, *args, **kwargs):
    in_child = multiprocessing.parent_process() is not None
    if (os.environ.get("KILL_WHERE", "main") == "child") != in_child:
        return _real_export(self, path, *args, **kwargs)
    with open(path, "w") as f:
        f.write('{"traceEvents": [' + " " * 65536)
    with open(path + ".tmp", "w") as f:
        f.write("x" * 4096)
    os.kill(os.getpid(), getattr(signal, os.environ["KILL_WITH"]))
    for _ in range(10000):  # a Python signal handler runs between these bytecodes
        pass
    return _real_export(self, path, *args, **kwargs)

torch.profiler.profile.export_chrome_trace = _export
"""

# One process, or a parent that joins a spawn child that may die.
KILLED_MAIN = """
import multiprocessing as mp
import os, signal, sys
import toymodel, sabotage

def bye(*_):
    print("graceful", flush=True)
    sys.exit(7)

if __name__ == "__main__":
    if os.environ.get("OWN_HANDLER"):
        signal.signal(signal.SIGTERM, bye)
    if os.environ.get("KILL_WHERE") == "child":
        p = mp.get_context("spawn").Process(target=toymodel.decode, args=(12,))
        p.start()
        p.join()
        print("child exit", p.exitcode)
    print("main", toymodel.decode(12))
"""


def _record(cwd: Path, target: str, program: list[str], **kw) -> subprocess.CompletedProcess[str]:
    args = ["--target", target, "--steps", str(N), "--warmup", str(W), "--timed-steps", str(K)]
    argv = [sys.executable, "-c", RUN_CLI, "record", *args, "--out", str(cwd / "traces"), "--", *program]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=180, check=False, **kw)


def _check_traces(out: Path, count: int, target: str) -> list[int]:
    traces = sorted(out.glob(TRACE_GLOB))
    assert len(traces) == count and all_files(out) == [p.name for p in traces]
    pids = []
    for path in traces:
        trace = load_trace(path)
        assert step_names(trace) == [f"ProfilerStep#{i}" for i in range(N)]
        assert trace["decodegap_record"]["target"] == target
        pids.append(trace["decodegap_record"]["pid"])
    return pids


# -- a target in the main script ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "method", "run_as"),
    [
        ("toy_decode:ToyRunner.forward_decode", "spawn", "path"),
        ("toy_decode:ToyRunner.forward_decode", "spawn", "-m"),
        ("toy_decode:ToyRunner.forward_decode", "fork", "path"),
        ("toy_decode:decode_step", "spawn", "path"),
        ("toy_decode:decode_step", "forkserver", "-m"),
    ],
)
def test_target_in_the_main_script(tmp_path: Path, target: str, method: str, run_as: str) -> None:
    (tmp_path / "toy_decode.py").write_text(textwrap.dedent(TOY_DECODE))
    program = [sys.executable, *(["toy_decode.py"] if run_as == "path" else ["-m", "toy_decode"]), "40", method]
    plain = subprocess.run(program, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    rec = _record(tmp_path, target, program)
    assert (rec.returncode, rec.stdout) == (plain.returncode, plain.stdout) == (0, plain.stdout)
    assert warning_lines(rec.stderr) == [], rec.stderr
    assert len(set(_check_traces(tmp_path / "traces", 2, target))) == 2  # the parent and its child


def test_main_script_typo_names_the_script(tmp_path: Path) -> None:
    single = textwrap.dedent(TOY_DECODE).split("def worker")[0] + "print(decode(12))\n"
    (tmp_path / "single.py").write_text(single)
    rec = _record(tmp_path, "single:ToyRunnr.forward_decode", [sys.executable, "single.py"])
    assert rec.returncode == NO_TRACE_EXIT  # the program exited 0, but no trace was written
    assert warning_lines(rec.stderr) == [
        "decodegap: warning: single:ToyRunnr.forward_decode was never wrapped: the main script single.py never "
        "defines 'ToyRunnr' (did you mean 'ToyRunner'?); no trace written"
    ]


# -- misspelt targets -----------------------------------------------------------------------------------


def _write_toymodel(folder: Path) -> None:
    (folder / "toymodel.py").write_text(textwrap.dedent(TOY_MODEL))
    (folder / "prog.py").write_text("import toymodel\nprint(toymodel.decode(12))\n")


def test_module_typo_says_the_module_was_never_imported(tmp_path: Path) -> None:
    _write_toymodel(tmp_path)
    rec = _record(tmp_path, "toymodl:Runner.decode_step", [sys.executable, "prog.py"])
    assert rec.returncode == NO_TRACE_EXIT  # the program exited 0, but no trace was written
    assert warning_lines(rec.stderr) == [
        "decodegap: warning: toymodl:Runner.decode_step was never called by any process of the program: no process "
        "imported module 'toymodl' (did you mean 'toymodel'?); no trace written"
    ]


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("toymodel:Runnr.decode_step", "module 'toymodel' has no attribute 'Runnr' (did you mean 'Runner'?)"),
        ("toymodel:Runner.decode_stp", "class Runner has no attribute 'decode_stp' (did you mean 'decode_step'?)"),
    ],
)
def test_attribute_typo_names_the_attribute(tmp_path: Path, target: str, why: str) -> None:
    _write_toymodel(tmp_path)
    rec = _record(tmp_path, target, [sys.executable, "prog.py"])
    assert rec.returncode == NO_TRACE_EXIT  # the program exited 0, but no trace was written
    assert warning_lines(rec.stderr) == [
        f"decodegap: warning: {target}: cannot wrap the target (AttributeError: {why}); "
        "the program continues without profiling"
    ]
    assert "circular import" not in rec.stderr


# -- a process killed while its trace is written --------------------------------------------------------


def _write_killed(folder: Path) -> None:
    (folder / "toymodel.py").write_text(textwrap.dedent(TOY_MODEL))
    (folder / "sabotage.py").write_text(textwrap.dedent(SABOTAGE))
    (folder / "main.py").write_text(textwrap.dedent(KILLED_MAIN))


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def test_sigkill_during_export_in_a_child(tmp_path: Path) -> None:
    _write_killed(tmp_path)
    rec = _record(tmp_path, "toymodel:Runner.decode_step", [sys.executable, "main.py"], env=_env(
        KILL_WITH="SIGKILL", KILL_WHERE="child"
    ))
    assert rec.returncode == 0 and f"child exit {-signal.SIGKILL}" in rec.stdout
    (main_pid,) = _check_traces(tmp_path / "traces", 1, "toymodel:Runner.decode_step")  # nothing hidden left
    (line,) = warning_lines(rec.stderr)
    assert line.startswith("decodegap: warning: process ") and line.split()[3] != str(main_pid)
    assert line.endswith(
        f"ran all {W + K + N} calls of toymodel:Runner.decode_step but died while writing its trace; "
        "removed its 2 partial file(s) (0.1 MB)"
    )
    assert "none completed" not in rec.stderr


def test_sigkill_during_export_of_the_only_process(tmp_path: Path) -> None:
    _write_killed(tmp_path)
    rec = _record(tmp_path, "toymodel:Runner.decode_step", [sys.executable, "main.py"], env=_env(KILL_WITH="SIGKILL"))
    assert rec.returncode == -signal.SIGKILL  # record dies the way its program did
    assert all_files(tmp_path / "traces") == []
    (line,) = warning_lines(rec.stderr)
    assert "died while writing its trace; removed its 2 partial file(s)" in line


def test_sigterm_during_export_cleans_up_in_the_process(tmp_path: Path) -> None:
    # Without record: nothing else would clean up, so the child's own handler must have.
    _write_killed(tmp_path)
    (tmp_path / "lib.py").write_text(
        "from decodegap.capture import StepProfiler\nimport toymodel, sabotage\n"
        f"sp = StepProfiler(warmup={W}, steps={N}, timed_steps={K}, out_dir='traces', enabled=True)\n"
        "toymodel.Runner.decode_step = sp.wrap(toymodel.Runner.decode_step)\nprint(toymodel.decode(12))\n"
    )
    run = subprocess.run(
        [sys.executable, "lib.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=_env(KILL_WITH="SIGTERM"), check=False,
    )
    assert run.returncode == -signal.SIGTERM  # the default action still happens
    assert all_files(tmp_path / "traces") == []
    assert warning_lines(run.stderr) == [
        "decodegap: warning: step: SIGTERM while writing the trace; its partial files were removed, no trace written"
    ]


def test_sigterm_during_export_chains_to_the_programs_handler(tmp_path: Path) -> None:
    _write_killed(tmp_path)
    rec = _record(
        tmp_path, "toymodel:Runner.decode_step", [sys.executable, "main.py"],
        env=_env(KILL_WITH="SIGTERM", OWN_HANDLER="1"),
    )
    assert (rec.returncode, rec.stdout) == (7, "graceful\n")
    assert all_files(tmp_path / "traces") == []
    assert warning_lines(rec.stderr) == [
        "decodegap: warning: toymodel:Runner.decode_step: writing the trace was interrupted (SystemExit); "
        "its partial files were removed, no trace written"
    ]


# -- the console summary of the unprofiled timing -------------------------------------------------------


def test_summary_prints_the_spread_and_a_bimodal_window(tmp_path: Path) -> None:
    (tmp_path / "two_prompts.py").write_text(
        textwrap.dedent("""
        import time

        class Runner:
            calls = 0

            def step(self):
                Runner.calls += 1
                time.sleep(0.002 if Runner.calls <= 7 else 0.03)  # a short prompt, then a long one
                if Runner.calls == 14:  # the second profiled step
                    raise ValueError("bad token")

        r = Runner()
        for _ in range(20):
            try:
                r.step()
            except ValueError:
                pass
        """)
    )
    args = ["--target", "two_prompts:Runner.step", "--steps", "2", "--warmup", "2", "--timed-steps", "10"]
    argv = [sys.executable, "-c", RUN_CLI, "record", *args, "--out", "traces", "--", sys.executable, "two_prompts.py"]
    rec = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert rec.returncode == 0 and warning_lines(rec.stderr) == [], rec.stderr
    lines = [line for line in rec.stderr.splitlines() if line.startswith("decodegap: record:     ")]
    assert len(lines) == 3, rec.stderr
    assert "unprofiled step" in lines[0] and " p10 " in lines[0] and " p90 " in lines[0]
    assert "(10 calls, wall)" in lines[0]
    assert "bimodal: 5 near " in lines[1] and ", 5 near " in lines[1]
    assert lines[2].endswith("note: the target raised ValueError in profiled step 1 (call 13)")
