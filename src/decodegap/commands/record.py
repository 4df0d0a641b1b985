"""`decodegap record`: run a program unchanged and capture a window of decode steps in each of its processes."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import tempfile

import click

from decodegap.errors import UserError

# The exit code of a run whose program succeeded but in which no process wrote a trace (a CI job must notice);
# a program that fails passes its own exit code (or signal) through instead.
NO_TRACE_EXIT = 3


@click.command(
    name="record",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="Run a program and capture decode steps in every process that calls the target.",
)
@click.option(
    "--target",
    required=True,
    metavar="MODULE:ATTR",
    help="Function or method called once per decode step, e.g. 'pkg.mod:Runner.forward_decode'.",
)
@click.option("--steps", default=10, show_default=True, type=int, help="Steps captured under torch.profiler.")
@click.option("--warmup", default=10, show_default=True, type=int, help="Calls left untouched first.")
@click.option(
    "--timed-steps",
    default=10,
    show_default=True,
    type=int,
    help="Calls timed without the profiler, after warmup (stored in the trace metadata).",
)
@click.option(
    "--out",
    "out_dir",
    default="decodegap-traces",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the traces (created if needed).",
)
@click.option(
    "--record-shapes/--no-record-shapes",
    default=False,
    show_default=True,
    help="Record op input shapes (more detail, slower profiled steps).",
)
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def command(
    target: str,
    steps: int,
    warmup: int,
    timed_steps: int,
    out_dir: str,
    record_shapes: bool,
    program: tuple[str, ...],
) -> None:
    """Run COMMAND with TARGET wrapped in it and in every Python process it starts (multiprocessing
    spawn/fork/forkserver workers, Python subprocesses), without changing the program's files.

    Each process that calls TARGET writes <host>.<pid>.rank-<rank>.decodegap.pt.trace.json.gz to --out
    after WARMUP + TIMED_STEPS + STEPS calls. The program's exit code and signals pass through.
    """
    from decodegap.capture import inject, launch, output
    from decodegap.capture.target import parse_target

    try:
        parsed = parse_target(target)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for name, value, least in (
        ("--steps", steps, 1),
        ("--warmup", warmup, 0),
        ("--timed-steps", timed_steps, 0),
    ):
        if value < least:
            raise UserError(f"{name} must be >= {least}, got {value}")
    if not program:
        raise UserError("missing COMMAND: give the program to run after '--', e.g. -- python serve.py")
    if shutil.which(program[0]) is None:
        raise UserError(f"command not found: {program[0]}")

    out_dir = os.path.abspath(out_dir)
    why = output.check_writable(out_dir)
    if why is not None:
        # Point of the tool: never stop the program. Run it unprofiled, and say so once.
        output.warn(f"cannot write traces: {why}; running the program without profiling")
        _exit(launch.run_forwarding_signals(program, os.environ), wrote=False)

    before = set(_traces(out_dir))
    status_dir = tempfile.mkdtemp(prefix="decodegap-record-")
    try:
        settings = inject.settings_env(
            str(parsed),
            steps=steps,
            warmup=warmup,
            timed_steps=timed_steps,
            out_dir=out_dir,
            record_shapes=record_shapes,
            status_dir=status_dir,
        )
        try:
            returncode = launch.run_forwarding_signals(program, launch.child_env(os.environ, settings))
        except OSError as exc:
            raise UserError(f"cannot run {program[0]}: {exc.strerror or exc}") from None
        new = sorted(set(_traces(out_dir)) - before)
        _summarize(str(parsed), new, status_dir, out_dir, warmup + timed_steps + steps)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    _exit(returncode, wrote=bool(new))


def _exit(returncode: int, wrote: bool) -> None:
    """Exit as the program did; a program that succeeded without any trace written exits NO_TRACE_EXIT."""
    from decodegap.capture import launch

    if returncode == 0 and not wrote:
        click.echo(f"decodegap: record: no trace written: exit code {NO_TRACE_EXIT} (the program itself exited 0)",
                   err=True)
        raise SystemExit(NO_TRACE_EXIT)
    launch.exit_like(returncode)


def _traces(out_dir: str) -> list[str]:
    from decodegap.capture.output import TRACE_SUFFIX

    return glob.glob(os.path.join(glob.escape(out_dir), "*" + TRACE_SUFFIX))


def _summarize(target: str, new: list[str], status_dir: str, out_dir: str, needed: int) -> None:
    """What happened, on stderr: the traces with their unprofiled timing, what dead processes left half-written
    (removed), and otherwise one line on why there is no trace."""
    from decodegap.capture import output

    marks = _read_marks(status_dir)
    removed = output.remove_dead_partials(out_dir)
    if new:
        click.echo(f"decodegap: record: {len(new)} trace(s) in {out_dir}", err=True)
        for path in new:
            click.echo(f"decodegap: record:   {os.path.basename(path)}", err=True)
            for line in _timing_lines(_trace_metadata(path, marks)):
                click.echo(f"decodegap: record:     {line}", err=True)
    unfinished = {pid for pid, events in marks.items() if not {"written", "reported"} & events.keys()}
    running = {pid for pid in unfinished if "called" in marks[pid] and output.process_alive(pid)}
    died_exporting = sorted(pid for pid in unfinished - running if "exporting" in marks[pid])
    for pid in died_exporting:
        left = [p for p in removed if p.pid == pid]
        cleaned = f"; removed its {len(left)} partial file(s) ({_mb(sum(p.size for p in left))})" if left else ""
        output.warn(f"process {pid} ran all {needed} calls of {target} but died while writing its trace{cleaned}")
    others = [p for p in removed if p.pid not in died_exporting]
    if running:
        output.warn(
            f"{len(running)} process(es) that called {target} still run after the program's main process "
            f"exited (pid {', '.join(str(pid) for pid in sorted(running))}); their traces may still appear in {out_dir}"
        )
    if others:
        output.warn(
            f"removed {len(others)} partial trace file(s) ({_mb(sum(p.size for p in others))}) left in {out_dir} "
            f"by process(es) {', '.join(str(pid) for pid in sorted({p.pid for p in others}))} that no longer run"
        )
    if not new:
        why = _why_no_trace(target, marks, needed, set(died_exporting) | running)
        if why:
            output.warn(why)
    sys.stderr.flush()


def _why_no_trace(target: str, marks: dict[int, dict[str, str]], needed: int, told: set[int]) -> str:
    def having(event: str) -> list[int]:
        return [pid for pid, events in marks.items() if event in events]

    called = having("called")
    if called or having("reported"):  # a process that reported said why, in its own warning line
        short = [pid for pid in called if pid not in told and "reported" not in marks[pid]]
        if not short:
            return ""
        return (
            f"{target} was called in {len(short)} process(es) that stopped before completing {needed} calls "
            "(warmup + timed + steps); no trace written"
        )
    notes = [marks[pid]["unresolved"] for pid in having("unresolved")]
    if notes:
        return f"{target} was never wrapped: {notes[0]}; no trace written"
    if having("wrapped"):
        return f"{target} was wrapped in {len(having('wrapped'))} process(es) but never called; no trace written"
    module = target.split(":", 1)[0]
    hints = sorted({marks[pid]["no-module"] for pid in having("no-module")} - {""})
    return (
        f"{target} was never called by any process of the program: no process imported module {module!r}"
        f"{hints[0] if hints else ''}; no trace written"
    )


def _read_marks(status_dir: str) -> dict[int, dict[str, str]]:
    """`<pid>.<event>` files (their text is the event's payload) as {pid: {event: payload}}."""
    marks: dict[int, dict[str, str]] = {}
    for name in os.listdir(status_dir):
        pid, _, event = name.partition(".")
        if not pid.isdigit() or not event:
            continue
        try:
            with open(os.path.join(status_dir, name), encoding="utf-8") as f:
                payload = f.read()
        except OSError:
            payload = ""
        marks.setdefault(int(pid), {})[event] = payload
    return marks


def _trace_metadata(path: str, marks: dict[int, dict[str, str]]) -> dict | None:
    # The file name is <host>.<pid>.rank-<rank>.decodegap.pt.trace.json.gz; the process left its metadata as a mark.
    match = re.search(r"\.(\d+)\.rank-", os.path.basename(path))
    pid = int(match.group(1)) if match else None
    payload = marks.get(pid, {}).get("written", "") if pid is not None else ""
    try:
        meta = json.loads(payload) if payload else None
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def _timing_lines(meta: dict | None) -> list[str]:
    timed = meta.get("unprofiled_step_ms") if meta else None
    if not isinstance(timed, dict) or timed.get("median") is None:
        return []
    count = len(timed.get("samples") or [])
    lines = [
        f"unprofiled step {timed['median']:.3f} ms median, p10 {timed['p10']:.3f}, p90 {timed['p90']:.3f} "
        f"({count} calls, {timed.get('clock')})"
    ]
    modes = timed.get("modes") or []
    if timed.get("bimodal") and len(modes) == 2:
        low, high = modes
        lines.append(
            f"note: the unprofiled samples are bimodal: {low['count']} near {low['median']:.3f} ms, "
            f"{high['count']} near {high['median']:.3f} ms (calls of two kinds, e.g. different shapes, in the "
            "timed window); compare the profiled steps with the right group"
        )
    for raised in (meta or {}).get("raised") or []:
        where = f"profiled step {raised['step']}" if raised.get("phase") == "profiled" else "a timed call"
        lines.append(f"note: the target raised {raised.get('exception')} in {where} (call {raised.get('call_index')})")
    return lines


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
