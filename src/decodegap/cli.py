"""Command-line entry point: parse arguments, call the library, print. Each command lives in decodegap.commands."""

from __future__ import annotations

import importlib
import sys

import click

from decodegap import __version__
from decodegap.commands import FLAGS
from decodegap.errors import ParameterError, UserError

# One module per command, each exposing `command` (a click.Command). Imported lazily so that
# `decodegap analyze` never pays for torch-backed commands.
COMMAND_MODULES = {
    "analyze": "decodegap.commands.analyze",
    "demo": "decodegap.commands.demo",
    "diff": "decodegap.commands.diff",
    "floor": "decodegap.commands.floor",
    "record": "decodegap.commands.record",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(name)
        if module is None:
            return None
        return importlib.import_module(module).command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="decodegap")
def cli() -> None:
    """decodegap: where every millisecond of an LLM decode step goes, and why."""


def _fail(message: str) -> None:
    click.echo(f"decodegap: error: {' '.join(str(message).split())}", err=True)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="decodegap", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(2)
    except click.UsageError as exc:
        _fail(exc.format_message())
    except ParameterError as exc:  # the library names Python parameters (tp=3); the command line, flags (--tp 3)
        _fail(exc.as_flags(FLAGS))
    except UserError as exc:
        _fail(str(exc))
    except click.exceptions.Abort:
        _fail("aborted")
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted")
    except BrokenPipeError:
        sys.exit(0)
