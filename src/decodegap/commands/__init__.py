"""One click command per module (analyze, floor, record, diff, demo), loaded lazily by decodegap.cli: the last
stage, the only place (with cli.py) that knows about flags. May import anything.

FLAGS maps the Python parameters that library errors name (decodegap.errors.ParameterError: `tp=3`) to the flags
the command line names instead (`--tp 3`), where the two spell them differently."""

FLAGS = {
    "tpot_ms": "--tpot",
    "bandwidth_gbps": "--bandwidth",
    "out": "--annotate",
    "fail_pct": "--fail-if-slower",
}
