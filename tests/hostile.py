"""Helpers for the hostile-input tests: real committed fixtures, the sanity check a report must pass, and a CLI run
in a fresh process that measures its own wall time and peak-memory growth."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


@lru_cache(maxsize=None)
def fixture_text(name: str) -> bytes:
    """The decompressed text of a committed fixture trace (tests/fixtures/traces/<name>.json.gz)."""
    return gzip.decompress((FIXTURES / f"{name}.json.gz").read_bytes())


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which are not JSON."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


def _finite_time(value, where: str) -> None:
    assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, f"{where} = {value!r}"


def _share(value, where: str) -> None:
    assert isinstance(value, (int, float)) and 0.0 <= value <= 1.0 + 1e-9, f"{where} = {value!r}"


def assert_sane_report(d: dict) -> None:
    """Finite, non-negative times and shares in [0, 1], wherever the report has them."""
    for key, value in d["steps"]["decode"]["ms"].items():
        if value is not None:
            _finite_time(value, f"steps.decode.ms.{key}")
    for i, value in enumerate(d["steps"]["decode"]["ms_each"] + d["steps"]["prefill"]["ms_each"]):
        _finite_time(value, f"ms_each[{i}]")
    for key in ("gpu_ms_per_step", "idle_ms_per_step", "kernels_per_step", "launch_us_per_kernel"):
        if d.get(key) is not None:
            _finite_time(d[key], key)
    if d.get("gpu_busy_fraction") is not None:
        _share(d["gpu_busy_fraction"], "gpu_busy_fraction")
    for c in d["categories"]:
        _finite_time(c["ms_per_step"], f"category {c['name']} ms")
        _share(c["share"], f"category {c['name']} share")
        _share(c["share_of_step"], f"category {c['name']} share_of_step")
    for k in d["kernels"]:
        for key in ("ms_per_step", "calls_per_step", "us_per_call"):
            _finite_time(k[key], f"kernel {k['name'][:40]} {key}")
        _share(k["share"], f"kernel {k['name'][:40]} share")


def assert_one_line(message: str) -> None:
    assert message.strip() and "\n" not in message.strip(), repr(message)
    assert "Traceback" not in message


@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str
    wall_s: float
    rss_growth_mb: float  # peak RSS growth over the command, past the imports


_RUNNER = """
import os, resource, sys, time
import decodegap.pipeline, decodegap.cli, decodegap.commands.analyze, decodegap.findings, decodegap.report.json
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
code = 0
try:
    decodegap.cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
wall = time.perf_counter() - t0
grow = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
with open(os.environ["DECODEGAP_TEST_MEASURE"], "w") as f:
    f.write(f"{code} {wall} {grow}")
"""


def run_cli_measured(args: list[str], tmp_path: Path, timeout: float = 120) -> CliRun:
    """`decodegap ARGS` in a fresh interpreter: exit code, output, wall time and peak RSS growth (MB)."""
    measure = tmp_path / "measure.txt"
    env = dict(os.environ, DECODEGAP_TEST_MEASURE=str(measure))
    result = subprocess.run([sys.executable, "-c", _RUNNER, *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    assert measure.exists(), result.stderr[-2000:]
    code, wall, grow = measure.read_text().split()
    return CliRun(int(code), result.stdout, result.stderr, float(wall), float(grow))
