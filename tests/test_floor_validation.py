"""The floor stays below every published measurement in docs/floor.md's validation table."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "floor_validation.py"
spec = importlib.util.spec_from_file_location("floor_validation", SCRIPT)
validation = importlib.util.module_from_spec(spec)
sys.modules["floor_validation"] = validation  # dataclasses look their module up there
spec.loader.exec_module(validation)


@pytest.mark.parametrize("m", validation.MEASUREMENTS, ids=lambda m: m.label)
def test_floor_below_published_measurement(m):
    assert validation.floor_for(m).tokens_per_s > m.measured_tok_s


def test_at_least_five_published_sources():
    assert len({m.source for m in validation.MEASUREMENTS if m.source.startswith("https://")}) >= 3
    assert len([m for m in validation.MEASUREMENTS if m.source.startswith("https://")]) >= 5
