"""Running the command line inside a test: exit code, stdout and stderr."""

from __future__ import annotations

import pytest

from decodegap.cli import main


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err
