"""The unprofiled timing summary stored as `unprofiled_step_ms`: spread, call index, the bimodality rule."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodegap.capture.timing import summary
from decodegap.samples import BIMODAL_MIN_REL_GAP, BIMODAL_MIN_SAMPLES, percentile, two_modes


def test_summary_keeps_call_order_index_and_spread() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    out = summary(samples, [10, 11, 12, 13, 14], "wall")
    assert out == {
        "median": 3.0,
        "samples": [5.0, 1.0, 4.0, 2.0, 3.0],  # call order, not sorted
        "call_index": [10, 11, 12, 13, 14],
        "clock": "wall",
        "p10": 1.4,
        "p90": 4.6,
        "bimodal": False,
        "modes": [],
    }


def test_summary_without_samples() -> None:
    assert summary([], [], "cuda_events") == {
        "median": None,
        "samples": [],
        "call_index": [],
        "clock": "cuda_events",
        "p10": None,
        "p90": None,
        "bimodal": False,
        "modes": [],
    }


def test_two_generate_calls_of_different_shapes_are_bimodal() -> None:
    # The timed window spans the end of one generate call (short prompt) and the start of another (long prompt).
    rng = random.Random(7)
    samples = [rng.gauss(30.0, 1.0) for _ in range(6)] + [rng.gauss(90.0, 3.0) for _ in range(4)]
    out = summary(samples, list(range(20, 30)), "cuda_events")
    assert out["bimodal"] is True
    (low, high) = out["modes"]
    assert (low["count"], high["count"]) == (6, 4)
    assert 28 < low["median"] < 32 and 85 < high["median"] < 95
    assert out["p10"] < 35 and out["p90"] > 80 and out["call_index"] == list(range(20, 30))


def test_the_two_groups_seen_on_hf_generate_are_found() -> None:
    # FACTS.md: "26-42 ms and 85-95 ms within 10 timed calls".
    samples = [26.0, 88.0, 31.0, 42.0, 95.0, 29.0, 85.0, 35.0, 91.0, 38.0]
    groups = two_modes(samples)
    assert groups is not None
    assert (len(groups[0]), len(groups[1])) == (6, 4) and max(groups[0]) == 42.0 and min(groups[1]) == 85.0


@pytest.mark.parametrize(
    "draw",
    [
        lambda r: r.gauss(30, 1.5),
        lambda r: 30 * math.exp(r.gauss(0, 0.5)),
        lambda r: 30 * math.exp(r.gauss(0, 1.0)),
        lambda r: r.uniform(20, 40),
        lambda r: 30 + r.expovariate(1 / 3),
        lambda r: 30 * r.paretovariate(2.5),
        lambda r: round(r.gauss(30, 0.3), 1),  # a coarse clock
    ],
    ids=["normal", "lognormal-0.5", "lognormal-1", "uniform", "exponential", "pareto", "quantized"],
)
def test_unimodal_noise_stays_unimodal(draw) -> None:
    rng = random.Random(2026)
    for n, trials, allowed in ((10, 300, 0.035), (20, 300, 0.01), (50, 200, 0.0), (200, 50, 0.0)):
        false_alarms = sum(two_modes([draw(rng) for _ in range(n)]) is not None for _ in range(trials))
        assert false_alarms <= allowed * trials, (n, false_alarms)


def test_one_outlier_is_not_a_mode() -> None:
    samples = [30.0 + 0.1 * i for i in range(9)] + [300.0]
    assert two_modes(samples) is None
    assert summary(samples, list(range(10)), "wall")["bimodal"] is False


def test_too_few_samples_are_never_bimodal() -> None:
    assert two_modes([1.0, 1.0, 1.0, 100.0, 100.0, 100.0, 100.0][: BIMODAL_MIN_SAMPLES - 1]) is None


@settings(max_examples=300, deadline=None)
@given(
    level=st.floats(min_value=1e-3, max_value=1e4),
    offsets=st.lists(st.floats(min_value=0.0, max_value=0.049), min_size=1, max_size=60),
)
def test_samples_within_five_percent_are_never_bimodal(level: float, offsets: list[float]) -> None:
    # A gap below BIMODAL_MIN_REL_GAP of the median never counts, however tight the two sides are.
    assert BIMODAL_MIN_REL_GAP == 0.05
    samples = [level * (1 + o) for o in offsets]
    out = summary(samples, list(range(len(samples))), "wall")
    assert out["bimodal"] is False and out["modes"] == []
    assert out["p10"] <= out["median"] <= out["p90"]


def test_percentile_interpolates_like_numpy() -> None:
    ordered = [1.0, 2.0, 4.0, 8.0]
    assert [percentile(ordered, q) for q in (0.0, 0.1, 0.5, 0.9, 1.0)] == pytest.approx([1.0, 1.3, 3.0, 6.8, 8.0])
