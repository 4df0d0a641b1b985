"""A draft model's forwards between the steps (steps.drafts): assisted generation / speculative decoding, on a real
H100 trace of transformers' assisted generation (a 2-layer ERNIE 4.5 drafting for a 6-layer one) whose generator
hooked both models, so its truth says which forward is whose."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tracegen import generate_loop, generate_loop_truth, write

from decodegap.steps import classify, marked_steps, sequence_steps
from decodegap.steps.drafts import draft_forwards
from decodegap.steps.steps import find_steps
from decodegap.trace.link import link
from decodegap.trace.load import load_trace

FIXTURES = Path(__file__).parent / "fixtures"


def _sequences(name: str) -> tuple[dict, list[np.ndarray]]:
    doc = json.loads((FIXTURES / "kernel_sequences" / f"{name}.json").read_text())
    return doc, [np.array(f, dtype=np.int64) for f in doc["forwards"]]


def _drafts(forwards: list[np.ndarray], names: list[str]):
    """draft_forwards on name sequences with every launch on one grid, and no output evidence."""
    return draft_forwards(forwards, names, [np.ones(len(f), np.int64) for f in forwards], None)


def test_the_draft_models_forwards_are_told_from_the_served_models():
    """All 13 forwards of one generate(): the draft's prefill and 5 extends, each before the served model's prefill,
    5 extends and last decode. The served model's per-layer kernels run 2 times in each draft forward, 6 in its own;
    its extends and its decode run unlike attention kernels, which must not hide that."""
    doc, forwards = _sequences("ernie4_5_assisted_generate")
    found = _drafts(forwards, doc["names"])
    assert found is not None
    assert sorted(found.forwards) == doc["truth"]["draft_forwards"] == [0, 2, 4, 6, 8, 10]
    assert (found.layers, found.of) == (doc["truth"]["draft_layers"], doc["truth"]["layers"]) == (2, 6)


def test_one_draft_forward_at_the_edge_is_no_draft_model():
    """A shorter forward at the capture's edge may be one the window cut: one draft forward, first, with two of the
    served model's after it, is not taken for a draft model."""
    doc, forwards = _sequences("ernie4_5_assisted_generate")
    assert _drafts([forwards[0], forwards[1], forwards[3]], doc["names"]) is None


def test_forwards_of_one_model_have_no_drafts():
    """Every forward of a single model (real decodes of an eager Nemotron-H hybrid, and of an eager MoE over a static
    cache, whose expert launches differ from forward to forward) is a step."""
    for name in ("nemotron_h_decode", "qwen3_moe_static_decode", "kimi_linear_decode"):
        doc, forwards = _sequences(name)
        assert _drafts(forwards, doc["names"]) is None, name


def test_assisted_generation_steps_are_the_served_models_forwards():
    """The real trace cut to its first three rounds: the steps are the served model's prefill and two extends (the
    generator's truth), each starting after the draft round before it, and the draft's three forwards are left out
    (P3 with them read as steps was P6)."""
    base = FIXTURES / "traces" / "ernie4_5_assisted_generate_3rounds"
    truth = json.loads(base.with_suffix(".truth.json").read_text())
    trace = load_trace(base.with_suffix(".json.gz"))
    steps = find_steps(trace, link(trace))
    served = truth["each_forward"]
    assert [s.kind for s in steps.steps] == ["prefill"] * (truth["steps"]["prefill"] + truth["steps"]["extend"])
    assert len(steps.steps) == len(served) == 3
    draft_ends = [f["cpu_end_ns"] for f in truth["assistant"]["each_forward"]]
    on_trace_clock = trace.origin_ns - trace.base_ns  # the generator's clock: time.time_ns() - baseTimeNanoseconds
    for step, forward in zip(steps.steps, served, strict=True):
        # its GPU work starts after the draft round before it ended and before its own forward's host side did
        start = step.start_ns + on_trace_clock
        assert max(d for d in draft_ends if d < forward["cpu_start_ns"]) <= start < forward["cpu_end_ns"]
    assert "3 forwards of a 2-layer draft model" in steps.detail


def test_forwards_that_run_no_output_head_have_no_drafts(monkeypatch):
    """An encoder's forward runs no output head and samples nothing, and is longer than the decoder's forwards after
    it, which run the same kernels in fewer layers. The assisted trace read with its served model's output-head rows
    taken out of the widest-GEMM rows and no sampling ops (as an encoder's forwards would show) keeps every forward as
    a step: six, not three."""
    trace = load_trace(FIXTURES / "traces" / "ernie4_5_assisted_generate_3rounds.json.gz")
    links = link(trace)
    served = np.concatenate([s.rows for s in find_steps(trace, links).steps])
    real = classify.widest_gemm_rows

    def without_served_heads(trace, links):
        head = real(trace, links).copy()
        head[served] = False
        return head

    def head_only(pieces, trace, links):  # the outputs by the output head alone: the forwards sample nothing
        head = without_served_heads(trace, links)
        return [bool(head[p.rows].any()) for p in pieces]

    for module in (classify, marked_steps, sequence_steps):
        monkeypatch.setattr(module, "widest_gemm_rows", without_served_heads)
    monkeypatch.setattr(classify, "_outputs", head_only)
    assert len(find_steps(trace, links).steps) == 6


def _phases_and_kernels(doc: dict, tmp_path: Path) -> tuple[list[str], list[int]]:
    trace = load_trace(write(doc, tmp_path / "loop.json"))
    found = find_steps(trace, link(trace)).steps
    return [s.kind for s in found], [len(s.rows) for s in found]


def _kernels_per_forward(doc: dict) -> list[int]:
    """GPU activities per forward of the served model, from the generator's tags (drafts carry none)."""
    tags = Counter(e["args"]["tracegen_forward"] for e in doc["traceEvents"]
                   if e.get("cat") == "kernel" and "tracegen_forward" in e["args"])
    return [tags[f] for f in sorted(tags)]


@pytest.mark.parametrize("record_shapes,experts,extend", [(False, 0, 0), (True, 0, 0), (True, 0, [3, 1, 2, 1, 1, 1, 1]),
                                                          (False, 8, 0), (True, 8, 0)])
def test_generated_assisted_loops_read_as_the_served_models_forwards(record_shapes, experts, extend, tmp_path):
    """tracegen's assisted generation: 2 draft forwards of a 2-layer model before each of a 6-layer model's forwards
    after its prefill (dense or eager MoE, decodes or verify extends, with and without op shapes). The steps are the
    served model's forwards, by the generator's phase, each holding its own kernels and none of the draft's."""
    doc = generate_loop(forwards=8, layers=6, drafts=2, draft_layers=2, record_shapes=record_shapes,
                        experts=experts, extend=extend)
    phases, kernels = _phases_and_kernels(doc, tmp_path)
    assert phases == generate_loop_truth(forwards=8, extend=extend)
    assert kernels == _kernels_per_forward(doc)


def test_served_forwards_whose_layers_launch_on_unlike_grids_have_no_drafts():
    """The served model's layers are one stack over the same tokens: each name that counts the draft's layers launches
    on one grid in all of them. Where the assisted trace's served forwards launch their first half on one grid and
    their second on another (as a vision tower or an encoder folded into a forward would), its shorter forwards are no
    drafts."""
    doc, forwards = _sequences("ernie4_5_assisted_generate")
    grids = [np.ones(len(f), np.int64) for f in forwards]
    assert draft_forwards(forwards, doc["names"], grids, None) is not None
    served = set(range(len(forwards))) - set(doc["truth"]["draft_forwards"])
    for i in served:
        grids[i] = np.where(np.arange(len(forwards[i])) < len(forwards[i]) // 2, 1, 2)  # two halves, two grids
    assert draft_forwards(forwards, doc["names"], grids, None) is None
    # nor where the trace records no grids (ROCm traces often do not): one stack is not shown
    unknown = [np.zeros(len(f), np.int64) for f in forwards]
    assert draft_forwards(forwards, doc["names"], unknown, None) is None


def test_forwards_that_end_in_no_output_have_no_drafts():
    """Forwards between the first and last that end in no output head or sampling (an encoder's) are no served model
    whose drafts propose tokens."""
    doc, forwards = _sequences("ernie4_5_assisted_generate")
    grids = [np.ones(len(f), np.int64) for f in forwards]
    outputs = [True] * len(forwards)
    assert draft_forwards(forwards, doc["names"], grids, outputs) is not None
    outputs[1] = False
    assert draft_forwards(forwards, doc["names"], grids, outputs) is None
