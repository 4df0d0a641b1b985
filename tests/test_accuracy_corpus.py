"""The accuracy corpus (issue 20): every real H200 trace in tests/fixtures/traces/corpus is read right.

Each trace has a truth file written by its generator (scripts/make_accuracy_corpus.py, from hooks and loop counters,
never from decodegap). A row is right when the steps by phase, the layer count, the sorted layer-kind counts and the
workload all equal the truth, or, for a cut file with no whole step left, when analyze refuses it with UserError.
The rules live in benchmarks/bench_accuracy.py (one row per trace, `accuracy: R/N traces right`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "traces" / "corpus"
_spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "benchmarks" / "bench_accuracy.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_accuracy"] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)

TRUTHS = sorted(CORPUS.glob("*.truth.json"))


def test_corpus_is_there():
    assert len(TRUTHS) >= 44
    for t in TRUTHS:
        assert (CORPUS / t.name.replace(".truth.json", ".json.gz")).exists(), t.name


@pytest.mark.parametrize("truth", TRUTHS, ids=[t.name.replace(".truth.json", "") for t in TRUTHS])
def test_trace_read_right(truth):
    row = bench.evaluate(str(truth))
    assert row.ok, (
        f"{row.name} ({row.family}, {row.loop}): wrong {', '.join(row.why)}; want steps {row.want_steps} layers "
        f"{row.want_layers} kinds {row.want_kinds} workload {row.want_workload}"
        + (" (a UserError)" if row.expect_error else "")
        + f"; got steps {row.got_steps} layers {row.got_layers} kinds {row.got_kinds} workload {row.got_workload}"
        + (f" error {row.got_error}" if row.got_error else "")
        + (f"; warnings {row.warnings}" if row.warnings else ""))
