"""`decodegap record`: run a program unchanged and capture a window of decode steps in each of its processes."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile

import click

from decodegap.errors import UserError


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
        launch.exit_like(launch.run_forwarding_signals(program, os.environ))

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
        _summarize(
            str(parsed),
            sorted(set(_traces(out_dir)) - before),
            status_dir,
            out_dir,
            warmup + timed_steps + steps,
        )
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    launch.exit_like(returncode)


def _traces(out_dir: str) -> list[str]:
    from decodegap.capture.output import TRACE_SUFFIX

    return glob.glob(os.path.join(glob.escape(out_dir), "*" + TRACE_SUFFIX))


def _summarize(target: str, new: list[str], status_dir: str, out_dir: str, needed: int) -> None:
    from decodegap.capture import output

    marks = os.listdir(status_dir)
    called = sum(m.endswith(".called") for m in marks)
    if new:
        click.echo(f"decodegap: record: {len(new)} trace(s) in {out_dir}", err=True)
        for path in new:
            click.echo(f"decodegap: record:   {os.path.basename(path)}", err=True)
    elif called == 0:
        output.warn(f"{target} was never called by any process of the program; no trace written")
    elif not any(m.endswith(".reported") for m in marks):
        # Processes that died before they could say why (killed, or os._exit) leave only this line.
        output.warn(
            f"{target} was called in {called} process(es), but none completed {needed} calls; "
            "no trace written"
        )
    sys.stderr.flush()
