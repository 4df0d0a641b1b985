"""`decodegap record` end to end, in subprocesses: an unmodified multi-process toy program is recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from decodegap.pipeline import analyze_path
from decodegap.report.json import report_dict
from _record_helpers import TRACE_GLOB, all_files, load_trace, step_names, warning_lines

from decodegap import cli
from decodegap.commands.record import NO_TRACE_EXIT

pytestmark = pytest.mark.slow  # subprocesses; a few seconds each

# The CLI as users run it; registers the command until cli.COMMAND_MODULES lists it.
RUN_CLI = (
    "import decodegap.cli as c; c.COMMAND_MODULES.setdefault('record', 'decodegap.commands.record'); c.main()"
)

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

def worker(n, q):
    q.put(decode(n))
"""

TOY_MAIN = """
import multiprocessing as mp
import sys
import toymodel

if __name__ == "__main__":
    n, method = int(sys.argv[1]), sys.argv[2]
    toymodel.decode(3)  # the parent calls the target before it starts a worker (a fork inherits this state)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=toymodel.worker, args=(n, q))
    p.start()
    print("main", toymodel.decode(n))
    print("worker", q.get())
    p.join()
    sys.exit(p.exitcode)
"""


def _write_toy(folder: Path) -> None:
    (folder / "toymodel.py").write_text(textwrap.dedent(TOY_MODEL))
    (folder / "main.py").write_text(textwrap.dedent(TOY_MAIN))


def _record(cwd: Path, args: list[str], program: list[str], **kw) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", RUN_CLI, "record", *args, "--", *program]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False, **kw)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_two_processes_each_write_n_steps(tmp_path: Path, method: str) -> None:
    _write_toy(tmp_path)
    program = [sys.executable, "main.py", "12", method]
    plain = subprocess.run(program, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    out = tmp_path / "traces"
    steps = 3
    rec = _record(
        tmp_path,
        [
            "--target",
            "toymodel:Runner.decode_step",
            "--steps",
            str(steps),
            "--warmup",
            "2",
            "--timed-steps",
            "2",
            "--out",
            str(out),
        ],
        program,
    )
    assert (rec.returncode, rec.stdout) == (plain.returncode, plain.stdout) == (0, plain.stdout)
    assert warning_lines(rec.stderr) == [], rec.stderr
    traces = sorted(out.glob(TRACE_GLOB))
    assert len(traces) == 2 and all_files(out) == [p.name for p in traces], rec.stderr
    pids = set()
    for path in traces:
        trace = load_trace(path)
        assert step_names(trace) == [f"ProfilerStep#{i}" for i in range(steps)]
        meta = trace["decodegap_record"]
        assert (meta["target"], meta["steps"], meta["warmup"], meta["timed_steps"]) == (
            "toymodel:Runner.decode_step",
            steps,
            2,
            2,
        )
        assert (
            meta["unprofiled_step_ms"]["clock"] == "wall" and len(meta["unprofiled_step_ms"]["samples"]) == 2
        )
        assert path.name.split(".")[-7] == str(meta["pid"])  # <host>.<pid>.rank-0.decodegap.pt.trace.json.gz
        pids.add(meta["pid"])
        # analyze reads the trace as a user would: exactly N decode steps, and the unprofiled time it stored.
        report = analyze_path(path)
        assert report.main.breakdown.decode_count == steps
        assert report.main.steps.source.startswith("profiler_step")
        assert report_dict(report)["profiler_check"]["source"].startswith("decodegap record")
    assert len(pids) == 2


NO_TORCH_PROGRAM = """
import os, sys
print("ran", os.environ.get("CHAINED_SITECUSTOMIZE"))
sys.exit(5)
"""


def test_never_called_exit_code_and_existing_sitecustomize(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'yes'\n")
    (tmp_path / "prog.py").write_text(NO_TORCH_PROGRAM)
    # the program's own PYTHONPATH entries stay (and decodegap's, where it is not installed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    rec = _record(
        tmp_path,
        ["--target", "nowhere.mod:f", "--out", str(tmp_path / "t")],
        [sys.executable, "prog.py"],
        env=env,
    )
    assert (rec.returncode, rec.stdout) == (5, "ran yes\n")  # the program's own failure passes through
    assert warning_lines(rec.stderr) == [
        "decodegap: warning: nowhere.mod:f was never called by any process of the program: "
        "no process imported module 'nowhere.mod'; no trace written"
    ]
    assert all_files(tmp_path / "t") == []


SHORT_PROGRAM = """
import sys
def step():
    return 1
for _ in range(int(sys.argv[1])):
    step()
print("done")
"""


def test_a_run_without_a_trace_exits_non_zero(tmp_path: Path) -> None:
    # 4 calls where warmup + timed + steps need 30: the program succeeds, record says so in its exit status
    (tmp_path / "short.py").write_text(SHORT_PROGRAM)
    rec = _record(tmp_path, ["--target", "short:step", "--out", str(tmp_path / "t")], [sys.executable, "short.py", "4"])
    assert (rec.returncode, rec.stdout) == (NO_TRACE_EXIT, "done\n")
    assert warning_lines(rec.stderr) == [
        "decodegap: warning: short:step: called 4 times, fewer than warmup 10 + timed 10 + steps 10 = 30; "
        "no trace written"
    ]
    assert f"no trace written: exit code {NO_TRACE_EXIT}" in rec.stderr
    assert all_files(tmp_path / "t") == []
    # an unwritable --out: the program runs unprofiled, and the exit status says that no trace came of it
    (tmp_path / "blocker").write_text("")
    rec = _record(tmp_path, ["--target", "short:step", "--out", str(tmp_path / "blocker" / "t")],
                  [sys.executable, "short.py", "4"])
    assert rec.returncode == NO_TRACE_EXIT


def test_unwritable_out_runs_program_unchanged(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    (tmp_path / "prog.py").write_text(NO_TORCH_PROGRAM)
    rec = _record(
        tmp_path, ["--target", "m:f", "--out", str(tmp_path / "blocker" / "t")], [sys.executable, "prog.py"]
    )
    assert (rec.returncode, rec.stdout) == (5, "ran None\n")
    (line,) = warning_lines(rec.stderr)
    assert "cannot write traces" in line


def test_sigterm_is_forwarded(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(
        textwrap.dedent("""
        import signal, sys, time
        def bye(*_):
            print("graceful", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        print("up", flush=True)
        time.sleep(60)
    """)
    )
    argv = [
        sys.executable,
        "-c",
        RUN_CLI,
        "record",
        "--target",
        "m:f",
        "--out",
        str(tmp_path / "t"),
        "--",
        sys.executable,
        "prog.py",
    ]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (7, "graceful\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "no_colon", "--", "true"], "bad target 'no_colon'"),
        (["--target", "m:f", "--steps", "0", "--", "true"], "--steps must be >= 1"),
        (["--target", "m:f"], "missing COMMAND"),
        (["--target", "m:f", "--", "surely-not-a-command-xyz"], "command not found"),
    ],
)
def test_user_errors(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(cli.COMMAND_MODULES, "record", "decodegap.commands.record")
    with pytest.raises(SystemExit) as exc:
        cli.main(["record", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
