"""Finding the steps (forward passes) of a trace, their phase, and what told us: the stage's entry point.

Direct evidence first, and the result says which was used (`Steps.source`, a stable id):
1. step annotations (`profiler_step`, `sglang_step`, `vllm_execute`): marked_steps.py;
2. graph launches (`graph_launch`), the once-per-forward anchors (`anchor_*`) or the repeating kernel sequence
   (`kernel_repetition`): sequence_steps.py;
3. the pieces made steps (phase, encoder joined, drafts left out, partial steps at the edges dropped): classify.py.
A partial step exists only at the edges of the capture (a last graph replay that ran only its graph's first kernels
is one); an interior step is never dropped. The types are in step.py."""

from __future__ import annotations

import numpy as np

from decodegap.errors import UserError
from decodegap.steps.anchors import lost_launches
from decodegap.steps.classify import classify
from decodegap.steps.marked_steps import from_marks
from decodegap.steps.marks import step_marks
from decodegap.steps.phase import is_training
from decodegap.steps.sequence_steps import from_launches_or_repetition
from decodegap.steps.step import PHASES, Step, Steps
from decodegap.trace.link import Links
from decodegap.trace.tables import Trace


def find_steps(trace: Trace, links: Links) -> Steps:
    steps = _find_steps(trace, links)
    if trace.truncated and trace.known_until_ns is not None and not steps.steps:
        raise UserError(f"{trace.path}: {_cut_words(trace, links)}")
    return steps


def _cut_words(trace: Trace, links: Links) -> str:
    """What a cut file kept: its kernels against those its CPU side launched (the launches the file lost, estimated
    from its CPU ops outside the launch records it kept, after the cut or before the first of them, and what each op
    of that name launched among them)."""
    ops, cut = trace.cpu_ops, trace.known_until_ns
    first = int(trace.runtime.ts_ns.min()) if len(trace.runtime.ts_ns) else cut
    before = (ops.ts_ns <= cut) & (ops.ts_ns >= min(first, cut))
    linked = links.op_idx[links.op_idx >= 0]
    kernels_per_op = np.bincount(ops.name_id[linked], minlength=len(trace.names)).astype(float)
    ops_before = np.bincount(ops.name_id[before], minlength=len(trace.names))
    rate = np.divide(kernels_per_op, ops_before, out=np.zeros(len(trace.names)), where=ops_before > 0)
    lost = int(round(rate[ops.name_id[~before]].sum())) + len(lost_launches(trace))
    kept = len(trace.gpu)
    held = (f"{kept} of the about {kept + lost} kernels its CPU side launched are in the file" if kept and lost else
            f"none of the GPU work its {len(ops.ts_ns)} CPU ops launched is in the file")
    return (f"truncated ({trace.truncated}): {held}, and no step ends before the cut (Kineto writes the GPU events "
            "after the CPU ops): capture again and let the profiler finish writing the file")


def _find_steps(trace: Trace, links: Links) -> Steps:
    training = is_training(trace)
    marks = step_marks(trace.annotations)
    found = from_marks(trace, links, marks) if trace.has_gpu else None
    if found is None and not trace.has_gpu and trace.truncated and trace.known_until_ns is not None:
        return Steps([], "none", "the file ends before its GPU events", "training" if training else "inference")
    if found is None and not trace.has_gpu:
        cpu = [m for m in marks.get("profiler_step", []) if not m.on_gpu]
        steps = [Step(i, "training" if training else "decode", m.ts_ns, m.end_ns, np.empty(0, np.int64), label=m.name)
                 for i, m in enumerate(cpu)]
        return Steps(steps, "profiler_step_cpu_only" if steps else "none",
                     "ProfilerStep annotations (CPU only, no GPU events)" if steps else "no GPU events, no step marks",
                     "training" if training else "inference")
    if found is None and len(trace.gpu) < 6:
        return Steps([], "none", "too few GPU events to find steps", "training" if training else "inference")
    if found is None:
        found = from_launches_or_repetition(trace, links, training)
    pieces, source, detail, warnings, *dropped = found
    return classify(trace, links, pieces, source, detail, warnings, training, sum(dropped))


def describe(steps: Steps, layers: int | None) -> str:
    """The first line of a report: what the trace is, e.g. '1 decode forward (batch 32) replayed by one HIP graph'."""
    if not steps.steps:
        return "no steps found"
    parts = []
    for phase in PHASES:
        group = steps.of(phase)
        if not group:
            continue
        noun = "iteration" if phase == "training" else "forward"
        batch = {s.batch for s in group if s.batch}
        extra = f" (batch {batch.pop()})" if len(batch) == 1 else ""
        parts.append(f"{len(group)} {phase} {noun}{'s' if len(group) != 1 else ''}{extra}")
    text = " + ".join(parts)
    if steps.graph_launches:
        one = steps.graph_launches == 1
        text += f" replayed by {'one' if one else steps.graph_launches} {steps.runtime} graph{'' if one else 's'}"
    if layers:
        text += f"; {layers} layers"
    return text
