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
from decodegap.steps.anchors import lookup_rows
from decodegap.steps.phase import GROWN_MOST, GROWN_SOME, GrowingRun, growing_runs
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


MOE_LOOPS = [dict(experts=experts, top_k=top_k, batch=batch, routing=routing, record_shapes=shapes, first=first)
             for (experts, top_k), batch, routing, shapes, first in
             itertools.product(((8, 2), (64, 8)), (1, 4), ("causal", "fresh"), (False, True), (0, 3))]


def _phases(tmp_path: Path, **kw) -> tuple[list[str], list[str]]:
    trace = load_trace(write(generate_loop(layers=4, **kw), tmp_path / "loop.json"))
    steps = find_steps(trace, link(trace))
    return [s.kind for s in steps.steps], steps.warnings


def _runs(tmp_path: Path, doc: dict) -> list:
    trace = load_trace(write(doc, tmp_path / "loop.json"))
    links = link(trace)
    steps = find_steps(trace, links)
    return growing_runs(trace, [s.rows for s in steps.steps], normalized_ids(trace.names, trace.gpu.name_id),
                        lookup_rows(trace, links))


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


@pytest.mark.parametrize("kw", MOE_LOOPS, ids=_name)
def test_eager_moe_forwards_without_a_kv_cache_are_prefills(tmp_path, kw):
    """An eager MoE loop without a cache: each forward's expert loop runs the experts its tokens were routed to (8
    experts top-2, or 64 top-8, where the set of experts that run changes from forward to forward), each on the tokens
    it got, after three one-block kernels that find them; those launches cannot grow for a token more, so well under
    half of a forward's launches grow over ten forwards. The embedding lookup grows with the sequence every forward
    recomputes: every forward is a prefill, with or without op shapes, whether a token keeps its experts from forward
    to forward (causal) or not (fresh)."""
    phases, warnings = _phases(tmp_path, forwards=10, kv_cache=False, **kw)
    assert phases == generate_loop_truth(forwards=10, kv_cache=False) == ["prefill"] * 10
    assert not _uncertain(warnings)


@pytest.mark.parametrize("kw", MOE_LOOPS, ids=_name)
def test_eager_moe_forwards_with_a_kv_cache_stay_prefill_then_decode(tmp_path, kw):
    """The same MoE loops with a KV cache: the prompt's prefill, then decode steps whose experts change every step;
    their lookups (one token per sequence) never grow."""
    phases, warnings = _phases(tmp_path, forwards=10, kv_cache=True, **kw)
    want = generate_loop_truth(forwards=10, kv_cache=True, first=kw["first"])
    assert phases == want
    assert Counter(want) == ({"prefill": 1, "decode": 9} if kw["first"] == 0 else {"decode": 10})
    assert not _uncertain(warnings)


@pytest.mark.parametrize("experts,top_k,batch,seed", [(8, 2, 1, 1), (128, 8, 1, 0), (64, 8, 2, 2)])
def test_routing_does_not_cut_a_run(tmp_path, experts, top_k, batch, seed):
    """Experts drawn anew every forward move the n-th launch of an expert kernel up in some places and down in others;
    such kernels say nothing of growth and are left out where consecutive forwards are compared, so the ten cacheless
    forwards stay one run, which recomputes by its lookups (4..7 blocks: 16..25 tokens per sequence) though under
    GROWN_MOST of its launches grew."""
    doc = generate_loop(forwards=10, layers=4, kv_cache=False, experts=experts, top_k=top_k, batch=batch,
                        routing="fresh", seed=seed)
    runs = _runs(tmp_path, doc)
    assert [(r.first, r.last) for r in runs] == [(0, 9)]
    assert runs[0].lookups == tuple(-(-batch * t * 2048 // 8192) for t in range(16, 26))
    assert runs[0].more_tokens and runs[0].recomputes and runs[0].grown < GROWN_MOST


def test_cached_moe_decode_runs_look_up_the_same_tokens(tmp_path):
    """A cached MoE loop: the decode run's lookups stay at one token per sequence (4 sequences: 1 block each), so it
    does not recompute, however its experts change."""
    runs = _runs(tmp_path, generate_loop(forwards=10, layers=4, kv_cache=True, experts=64, top_k=8, batch=4,
                                         routing="fresh"))
    assert runs and all(r.first >= 1 and not r.more_tokens and not r.recomputes for r in runs)
    assert {r.lookups for r in runs} == {(1,) * (r.last - r.first + 1) for r in runs}


def _nest_lookups(doc: dict) -> dict:
    """The lookup as PyTorch records it: `aten::embedding` calls `aten::index_select`, which launches the kernel."""
    events = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::embedding":
            events.append(dict(e, ts=e["ts"] - 1.0, dur=e["dur"] + 2.0, args={"External id": 10 ** 7 + len(events)}))
            e = dict(e, name="aten::index_select")
        events.append(e)
    return dict(doc, traceEvents=events)


def test_a_lookup_is_what_runs_inside_the_embedding_op(tmp_path):
    """Real traces launch the lookup's kernel from `aten::index_select` (or `aten::gather`) inside `aten::embedding`:
    the kernels launched inside that op's span are the lookup. The MoE loop without a cache reads as prefills so."""
    doc = _nest_lookups(generate_loop(forwards=10, layers=4, kv_cache=False, experts=64, top_k=8, batch=2))
    trace = load_trace(write(doc, tmp_path / "loop.json"))
    links = link(trace)
    lookup = lookup_rows(trace, links)
    names = {trace.names[i] for i in trace.gpu.name_id[lookup].tolist()}
    assert len(names) == 1 and "indexSelectLargeIndex" in names.pop() and int(lookup.sum()) == 10
    assert [s.kind for s in find_steps(trace, links).steps] == generate_loop_truth(forwards=10, kv_cache=False)


@pytest.mark.parametrize("lookups,kernels,more", [
    ((4, 5, 5, 6, 7), (1,) * 5, True),  # a cacheless loop: one token more per forward, a block per four tokens
    ((2, 17, 18, 19), (1, 2, 2, 2), True),  # PyTorch looked the first forward up with another kernel (batch 1)
    ((2, 2, 2, 2), (1,) * 4, False),  # decode steps: one token per sequence every step
    ((1, 1, 1, 16), (1,) * 4, False),  # decode steps, then a new prompt: a jump, not a token more
    ((1, 1, 1, 2), (1,) * 4, True),  # ... unless it only doubles (the launches' DOUBLED rule cuts such runs first)
    ((2, 2, 2, 17), (1, 1, 1, 2), False),  # a new prompt looked up by another kernel: nothing grew
    ((8, 9, 7, 10), (1,) * 4, False),  # a lookup that shrinks is no recomputed sequence
])
def test_more_tokens_compares_lookups_of_the_same_kernels(lookups, kernels, more):
    """The lookups of a run say it recomputes when, between consecutive forwards whose lookup ran the same kernels,
    they never shrink nor more than double, and grow at least once."""
    run = GrowingRun(0, len(lookups) - 1, 0.1, lookups, tuple((k,) for k in kernels))
    assert run.more_tokens is more and run.recomputes is more


@pytest.mark.parametrize("extend", (3, 8, 32))
@pytest.mark.parametrize("attention", ("eager", "sdpa"))
@pytest.mark.parametrize("experts", (0, 8))
def test_a_prefill_an_extend_and_one_decode_read_as_they_ran(tmp_path, extend, attention, experts):
    """Three forwards, as a short capture or a cut file keeps them: the prompt's prefill, an extend of `extend` new
    tokens, one decode; no op shapes; an MLP or an eager MoE (an extend's tokens reach more experts: more small
    kernels, so fewer blocks a launch on average than the decode's). Each launches unlike the others and no majority
    says which is typical: the decode is the smallest step, which the others outgrow kernel by kernel on the launches
    they share, and the other two are prefills."""
    phases, _ = _phases(tmp_path, forwards=3, kv_cache=True, extend=extend, attention=attention, experts=experts)
    assert phases == generate_loop_truth(forwards=3, kv_cache=True, extend=extend) == ["prefill", "prefill", "decode"]



@pytest.mark.parametrize("seed", range(3))
def test_prompt_lookup_extends_among_decodes_read_as_prefills(tmp_path, seed):
    """Prompt-lookup decoding with an eager MoE, no op shapes: after the prompt, forwards verifying 3 or 5 tokens
    (extends) among decodes of one. Their lookups grow from a decode's (1, 3, 5 tokens) but stay under the prompt's:
    no loop without a cache, which looks the whole sequence up. No majority launches alike, and the extends, whose
    tokens reach more experts, run more small kernels: fewer blocks a launch on average than a decode, though each
    launch they share with a decode runs on at least as many. The decodes are the smallest steps; the generator's
    phases are read."""
    news = [1, 1, 3, 5, 1, 5, 3]
    phases, _ = _phases(tmp_path, forwards=8, kv_cache=True, extend=news, experts=8, top_k=2, batch=1, seed=seed)
    assert phases == generate_loop_truth(forwards=8, kv_cache=True, extend=news)
    assert phases == ["prefill", "decode", "decode", "prefill", "prefill", "decode", "prefill", "prefill"]


@pytest.mark.parametrize("kw", [
    dict(forwards=12, layers=8, prompt=8, batch=4, logits="all", first=2, experts=4, routing="fresh", seed=308),
    dict(forwards=6, layers=6, prompt=8, logits="last", generations=2, experts=4, routing="fresh", seed=167,
         extend=[1, 3, 1, 2]),
    dict(forwards=12, layers=6, prompt=8, batch=4, logits="last", experts=8, routing="causal", seed=329, drafts=2),
], ids=["decodes-only", "extends", "assisted"])
def test_eager_moe_steps_whose_experts_change_every_step_keep_their_phase(tmp_path, kw):
    """Eager MoE loops without op shapes, where which experts run, and on how many tokens, changes every forward: the
    expert loop's launches (kernels run three or more different numbers of times) tell no phase, the kernels every
    forward runs as often do. A capture of decodes alone reads no prefill; extends among decodes and an assisted
    generation's served forwards read as the generator says."""
    trace = load_trace(write(generate_loop(**kw), tmp_path / "moe.json"))
    assert [s.kind for s in find_steps(trace, link(trace)).steps] == generate_loop_truth(**kw)


def test_decodes_before_a_short_prompt_are_no_recomputing_run(tmp_path):
    """Two generate calls of an eager MoE with a 4-token prompt over 2 sequences, op shapes recorded: the second
    prompt's prefill launches the embedding lookup on 2 blocks after the decodes' 1, so the last decodes and that
    prefill look like a run of forwards that recompute a growing sequence. The projection rows say otherwise (2 and 2,
    then 8): the decodes stay decodes, the generator's phases."""
    kw = dict(forwards=8, layers=2, prompt=4, batch=2, record_shapes=True, generations=2, experts=8, seed=205)
    trace = load_trace(write(generate_loop(**kw), tmp_path / "two_prompts.json"))
    assert [s.kind for s in find_steps(trace, link(trace)).steps] == generate_loop_truth(**kw)


@pytest.mark.parametrize("kw", [dict(forwards=8, first=5, record_shapes=True), dict(forwards=8, first=5),
                                dict(forwards=12)], ids=["mid-shapes", "mid", "generate"])
def test_decodes_whose_attention_grids_drift_stay_decodes(tmp_path, kw):
    """Eager attention over a 200-token prompt of 8 sequences: each decode step's attention launches follow the
    growing keys, so the late decodes' launch sets drift away from the typical step's and read as another group by
    their launches. They only grow gradually from one forward to the next and recompute nothing: decodes, the
    generator's phases (a capture from the sixth forward on holds no prefill)."""
    kw = dict(kw, layers=4, prompt=200, batch=8)
    trace = load_trace(write(generate_loop(**kw), tmp_path / "drift.json"))
    assert [s.kind for s in find_steps(trace, link(trace)).steps] == generate_loop_truth(**kw)
