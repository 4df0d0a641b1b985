"""A draft model's forwards between the steps (steps.drafts): assisted generation / speculative decoding, on a real
H100 trace of transformers' assisted generation (a 2-layer ERNIE 4.5 drafting for a 6-layer one) whose generator
hooked both models, so its truth says which forward is whose."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from decodegap.steps.drafts import draft_forwards
from decodegap.steps import steps as steps_module
from decodegap.steps.steps import find_steps
from decodegap.trace.link import link
from decodegap.trace.load import load_trace

FIXTURES = Path(__file__).parent / "fixtures"


def _sequences(name: str) -> tuple[dict, list[np.ndarray]]:
    doc = json.loads((FIXTURES / "kernel_sequences" / f"{name}.json").read_text())
    return doc, [np.array(f, dtype=np.int64) for f in doc["forwards"]]


def test_the_draft_models_forwards_are_told_from_the_served_models():
    """All 13 forwards of one generate(): the draft's prefill and 5 extends, each before the served model's prefill,
    5 extends and last decode. The served model's per-layer kernels run 2 times in each draft forward, 6 in its own;
    its extends and its decode run unlike attention kernels, which must not hide that."""
    doc, forwards = _sequences("ernie4_5_assisted_generate")
    found = draft_forwards(forwards, doc["names"])
    assert found is not None
    assert sorted(found.forwards) == doc["truth"]["draft_forwards"] == [0, 2, 4, 6, 8, 10]
    assert (found.layers, found.of) == (doc["truth"]["draft_layers"], doc["truth"]["layers"]) == (2, 6)


def test_one_draft_forward_at_the_edge_is_no_draft_model():
    """A shorter forward at the capture's edge may be one the window cut: one draft forward, first, with two of the
    served model's after it, is not taken for a draft model."""
    doc, forwards = _sequences("ernie4_5_assisted_generate")
    assert draft_forwards([forwards[0], forwards[1], forwards[3]], doc["names"]) is None


def test_forwards_of_one_model_have_no_drafts():
    """Every forward of a single model (real decodes of an eager Nemotron-H hybrid, and of an eager MoE over a static
    cache, whose expert launches differ from forward to forward) is a step."""
    for name in ("nemotron_h_decode", "qwen3_moe_static_decode", "kimi_linear_decode"):
        doc, forwards = _sequences(name)
        assert draft_forwards(forwards, doc["names"]) is None, name


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
    """An encoder's forward runs no output head, and is longer than the decoder's forwards after it, which run the
    same kernels in fewer layers. The assisted trace read with its served model's output-head rows taken out of the
    widest-GEMM rows (as an encoder's forwards would show) keeps every forward as a step: six, not three."""
    trace = load_trace(FIXTURES / "traces" / "ernie4_5_assisted_generate_3rounds.json.gz")
    links = link(trace)
    served = np.concatenate([s.rows for s in find_steps(trace, links).steps])
    real = steps_module.widest_gemm_rows

    def without_served_heads(trace, links):
        head = real(trace, links).copy()
        head[served] = False
        return head

    monkeypatch.setattr(steps_module, "widest_gemm_rows", without_served_heads)
    assert len(find_steps(trace, links).steps) == 6
