"""Forwards that recompute the whole sequence (a generate loop without a KV cache, HF's `use_cache=False`) are
prefills, with or without op shapes; a loop with a KV cache still reads as one prefill and then decode steps. The
truth per forward comes from the generator (`tracegen.generate_loop_truth`), never from decodegap."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from decodegap.pipeline import analyze_path
from decodegap.report.json import report_dict
from decodegap.steps.phase import GROWN_MOST, GROWN_SOME, growing_runs
from decodegap.steps.repetition import normalized_ids
from decodegap.steps.steps import find_steps
from decodegap.trace.link import link
from decodegap.trace.load import load_trace
from tracegen import generate_loop, generate_loop_truth, write

LOOPS = [dict(record_shapes=shapes, attention=attention, logits=logits, first=first, batch=batch)
         for shapes, attention, logits, first, batch in
         itertools.product((False, True), ("eager", "sdpa"), ("all", "last"), (0, 3), (1, 4))]


def _name(kw: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in kw.items())


def _phases(tmp_path: Path, **kw) -> tuple[list[str], list[str]]:
    trace = load_trace(write(generate_loop(layers=4, **kw), tmp_path / "loop.json"))
    steps = find_steps(trace, link(trace))
    return [s.kind for s in steps.steps], steps.warnings


def _uncertain(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "phase is uncertain" in w]


@pytest.mark.parametrize("kw", LOOPS, ids=_name)
def test_forwards_without_a_kv_cache_are_prefills(tmp_path, kw):
    """Ten forwards over 16..25 (or 19..28) tokens: every one a prefill, with or without shapes, eager or SDPA
    attention, the lm_head over every position or the last only; no doubt is voiced."""
    phases, warnings = _phases(tmp_path, forwards=10, kv_cache=False, **kw)
    assert phases == generate_loop_truth(forwards=10, kv_cache=False) == ["prefill"] * 10
    assert not _uncertain(warnings)


@pytest.mark.parametrize("kw", LOOPS, ids=_name)
def test_forwards_with_a_kv_cache_stay_prefill_then_decode(tmp_path, kw):
    """The same loop with a KV cache: the prompt's prefill, then decode steps (all decode when the capture starts
    mid-generation)."""
    phases, warnings = _phases(tmp_path, forwards=10, kv_cache=True, **kw)
    want = generate_loop_truth(forwards=10, kv_cache=True, first=kw["first"])
    assert phases == want
    assert Counter(want) == ({"prefill": 1, "decode": 9} if kw["first"] == 0 else {"decode": 10})
    assert not _uncertain(warnings)


@pytest.mark.parametrize("kv_cache", (True, False))
@pytest.mark.parametrize("record_shapes", (False, True))
def test_two_generate_calls_back_to_back(tmp_path, kv_cache, record_shapes):
    """Two generate calls of 5 forwards: with a cache the second prompt's prefill follows a decode step (its launches
    jump, by the prompt's length, rather than grow by a token) and is read as a prefill again; without one all ten
    forwards are prefills."""
    phases, _ = _phases(tmp_path, forwards=5, generations=2, kv_cache=kv_cache, record_shapes=record_shapes)
    want = generate_loop_truth(forwards=5, generations=2, kv_cache=kv_cache)
    assert phases == want
    assert want == ((["prefill"] + ["decode"] * 4) * 2 if kv_cache else ["prefill"] * 10)


def test_growing_runs_split_where_the_launches_collapse_or_jump(tmp_path):
    """The runs themselves: a cached loop's prefill stands alone (its launches collapse into the decode step's), the
    decode run grows little; a loop without a cache is one run that grows most of its launches."""
    def runs(**kw):
        trace = load_trace(write(generate_loop(layers=4, **kw), tmp_path / "loop.json"))
        steps = find_steps(trace, link(trace))
        return growing_runs(trace, [s.rows for s in steps.steps], normalized_ids(trace.names, trace.gpu.name_id))

    cached = runs(forwards=10, kv_cache=True)
    assert [(r.first, r.last) for r in cached] == [(1, 9)]
    assert cached[0].grown < GROWN_SOME and not cached[0].recomputes
    uncached = runs(forwards=10, kv_cache=False)
    assert [(r.first, r.last) for r in uncached] == [(0, 9)]
    assert uncached[0].grown >= GROWN_MOST and uncached[0].recomputes
    twice = runs(forwards=5, generations=2, kv_cache=True)
    assert [(r.first, r.last) for r in twice] == [(1, 4), (6, 9)]


def test_two_forwards_without_shapes_are_uncertain_and_say_so(tmp_path):
    """Two forwards one token apart, no op shapes: a third of the launches grew, which neither a decode step over a
    cache nor a recomputing loop explains for sure: the report says the phase is uncertain."""
    phases, warnings = _phases(tmp_path, forwards=2, kv_cache=False, first=3)
    assert len(phases) == 2
    words = _uncertain(warnings)
    assert len(words) == 1 and words[0].startswith("forwards 0-1: 35% of the kernel launches")


def test_the_report_counts_the_prefills(tmp_path):
    """End to end: the JSON report of a loop without a cache holds 10 prefill forwards and no decode step."""
    d = report_dict(analyze_path(write(generate_loop(forwards=10, layers=4, kv_cache=False), tmp_path / "l.json")))
    assert (d["steps"]["prefill"]["count"], d["steps"]["decode"]["count"]) == (10, 0)
    assert [r["phase"] for r in d["step_rows"]] == ["prefill"] * 10
