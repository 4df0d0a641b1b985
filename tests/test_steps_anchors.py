"""Steps from once-per-forward evidence (issue 20), on hand-built forwards whose truth the generator tags into every
event (`args.tracegen_forward`): eager MoE forwards that launch a different number of kernels each, unlike layers,
deep stacks, cut windows and cut files. The real-trace classes run on the corpus (test_accuracy_corpus.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from tracegen import engine_forwards, generate_loop, generate_loop_truth, kineto_order, training_loop, write

from decodegap.errors import UserError
from decodegap.pipeline import analyze_path
from decodegap.report.json import report_dict
from decodegap.steps.steps import find_steps
from decodegap.trace.link import link
from decodegap.trace.load import load_trace

H200 = Path(__file__).parent / "fixtures" / "traces" / "gpu_h200"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _d(path) -> dict:
    return report_dict(analyze_path(path))


def _counts(d: dict) -> dict:
    return {p: c for p in ("decode", "prefill", "mixed", "training") if (c := d["steps"][p]["count"])}


def _kernels_per_forward(doc: dict) -> list[int]:
    tags = Counter(e["args"]["tracegen_forward"] for e in doc["traceEvents"] if e.get("cat") == "kernel")
    return [tags[f] for f in sorted(tags)]


def _kinds(d: dict) -> list[int]:
    return sorted(k["count"] for k in d["layer_kinds"]) or [d["layers"]]


def test_eager_moe_forwards_launch_different_counts_and_all_are_kept(tmp_path):
    doc = engine_forwards(forwards=9, layers=6, moe_from=1, phases=("prefill",) + ("decode",) * 8, batch=2)
    per_forward = _kernels_per_forward(doc)
    assert len(set(per_forward[1:])) > 1  # the data decides how many kernels each decode forward launches
    d = _d(write(doc, tmp_path / "moe.json"))
    assert _counts(d) == {"prefill": 1, "decode": 8}
    assert d["steps"]["dropped_partial"] == 0 and d["steps"]["source"] == "anchor_embedding"
    assert d["layers"] == 6 and _kinds(d) == [1, 5]  # one dense layer, five MoE layers
    assert d["steps"]["decode"]["ms_each"] and len(d["step_rows"]) == 9


def test_unlike_layers_are_counted_per_kind(tmp_path):
    doc = engine_forwards(forwards=4, layers=8, moe_from=3, batch=1)
    d = _d(write(doc, tmp_path / "dense_moe.json"))
    assert _counts(d) == {"decode": 4} and d["layers"] == 8 and _kinds(d) == [3, 5]
    kinds = {r["kind"] for r in d["layer_rows"]}
    assert len(d["layer_rows"]) == 8 and len(kinds) == 2
    assert [r["kind"] for r in d["layer_rows"]][:3] == [d["layer_rows"][0]["kind"]] * 3  # the dense ones first


def test_a_deep_eager_stack_without_markers_is_cut_into_its_forwards(tmp_path):
    d = _d(write(engine_forwards(forwards=8, layers=48, batch=1), tmp_path / "deep.json"))
    assert _counts(d) == {"decode": 8} and d["layers"] == 48 and _kinds(d) == [48]


def test_training_without_profiler_steps_counts_optimizer_steps(tmp_path):
    doc = json.loads(gzip.open(H200 / "train_steps.json.gz").read())
    truth = json.loads((H200 / "train_steps.truth.json").read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    d = _d(write(doc, tmp_path / "train.json"))
    assert d["workload"] == "training" and d["steps"]["source"] == "anchor_optimizer_step"
    assert _counts(d) == {"training": truth["steps"]["training"]} == {"training": 3}


def _without_forward_part(doc: dict, forward: int, keep_first: bool) -> dict:
    """The capture window cut inside a forward: its GPU and host events from its middle on (or up to it) removed."""
    mine = [e for e in doc["traceEvents"] if e.get("args", {}).get("tracegen_forward") == forward and "ts" in e]
    middle = sorted(e["ts"] for e in mine)[len(mine) // 2]
    gone = {id(e) for e in mine if (e["ts"] >= middle) == keep_first}
    return doc | {"traceEvents": [e for e in doc["traceEvents"] if id(e) not in gone]}


@pytest.mark.parametrize("begin_cut,end_cut", [(True, False), (False, True), (True, True)])
def test_only_forwards_the_window_cut_are_partial(tmp_path, begin_cut, end_cut):
    forwards = 7
    doc = engine_forwards(forwards=forwards, layers=6, moe_from=2, batch=2)
    if begin_cut:
        doc = _without_forward_part(doc, 0, keep_first=False)
    if end_cut:
        doc = _without_forward_part(doc, forwards - 1, keep_first=True)
    d = _d(write(doc, tmp_path / "window.json"))
    whole = forwards - begin_cut - end_cut
    assert _counts(d) == {"decode": whole} and d["steps"]["dropped_partial"] == begin_cut + end_cut
    assert d["layers"] == 6



@pytest.mark.parametrize("moe_from", [1, 2])
def test_a_window_with_two_whole_forwards_between_two_it_cut_finds_both(tmp_path, moe_from):
    """A window that opens and closes inside a forward and holds two whole ones between: the forward it closed in
    runs fewer of every per-layer kernel, so only the whole ones tell which kernels' counts depend on the data (an
    eager MoE layer's experts); with it among them, no kernel was left to count the layers by."""
    forwards = 4
    doc = engine_forwards(forwards=forwards, layers=6, moe_from=moe_from, batch=2)
    doc = _without_forward_part(doc, 0, keep_first=False)
    # the window closes in the last forward's third layer (prof.stop() from a layer's hook): what the host had not yet
    # launched is not in the trace
    last = [e for e in doc["traceEvents"] if e.get("args", {}).get("tracegen_forward") == forwards - 1 and "ts" in e]
    host = sorted(e["ts"] for e in last if e.get("cat") in ("cpu_op", "cuda_runtime"))
    stop = host[len(host) * 2 // 5]
    late = {e["args"]["correlation"] for e in last if e.get("cat") == "cuda_runtime" and e["ts"] >= stop}
    mine = {id(e) for e in last}
    doc = doc | {"traceEvents": [e for e in doc["traceEvents"] if not (id(e) in mine and (
        e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation") and e["ts"] >= stop
        or e.get("args", {}).get("correlation") in late))]}
    d = _d(write(doc, tmp_path / "window.json"))
    assert _counts(d) == {"decode": 2} and d["steps"]["dropped_partial"] == 2
    assert d["layers"] == 6 and d["steps"]["source"] == "anchor_embedding"

def _cut_text(doc: dict, keep_gpu_events: int, events: list[dict] | None = None) -> bytes:
    """Kineto's order (or that of `events`) and layout, cut right after the first `keep_gpu_events` GPU-side events."""
    events = kineto_order(doc)["traceEvents"] if events is None else events
    lines, seen = [], 0
    for i, e in enumerate(events):
        lines.append(json.dumps(e))
        if e.get("cat") not in ("cpu_op", "user_annotation"):
            seen += 1
            if seen == keep_gpu_events:
                lines.append(json.dumps(events[i + 1])[:20])  # the file ends inside the next event
                break
    return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],\n  "traceEvents": [\n'
            + ",\n".join("  " + line for line in lines)).encode()


def test_a_cut_file_keeps_only_the_steps_whose_launches_all_have_kernels(tmp_path):
    doc = engine_forwards(forwards=6, layers=6, moe_from=1, batch=2)
    gpu_side = [e for e in kineto_order(doc)["traceEvents"] if e.get("cat") not in ("cpu_op", "user_annotation")]
    keep = int(len(gpu_side) * 0.6)
    kept = gpu_side[:keep]
    # the generator's truth: a forward is whole when every kernel and launch it made is before the cut
    whole = sum(all(e in kept for e in gpu_side if e["args"]["tracegen_forward"] == f) for f in range(6))
    assert 0 < whole < 5
    path = tmp_path / "cut.json"
    path.write_bytes(_cut_text(doc, keep))
    d = _d(path)
    assert _counts(d) == {"decode": whole}
    assert any("truncated" in w for w in d["warnings"])


def test_a_cut_file_with_no_whole_step_is_refused_with_the_figures(tmp_path):
    doc = engine_forwards(forwards=6, layers=6, moe_from=1, batch=2)
    gpu_side = [e for e in kineto_order(doc)["traceEvents"] if e.get("cat") not in ("cpu_op", "user_annotation")]
    first_forward = sum(e["args"]["tracegen_forward"] == 0 for e in gpu_side)
    path = tmp_path / "cut.json"
    path.write_bytes(_cut_text(doc, first_forward // 2))
    kernels_kept = sum(e.get("cat") == "kernel" for e in gpu_side[:first_forward // 2])
    with pytest.raises(UserError, match=rf"truncated .*: {kernels_kept} of the about \d+ kernels"):
        analyze_path(path)
    run = subprocess.run([sys.executable, "-m", "decodegap", "analyze", str(path)], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("moe_every", [None, 1, 2])
def test_training_iterations_are_cut_at_their_optimizer_steps_whatever_their_layers(tmp_path, moe_every):
    """Training iterations with no ProfilerStep marks (forward, backward on the autograd thread, fused AdamW), of a
    dense stack, an all-MoE one and one whose MoE layers sit between dense ones (the iterations' layer counts then
    read unlike): the generator's 6 iterations, each with exactly its own kernels, and its 6 layers. Where the
    iterations' layers read unlike, the optimizer steps (as many as the embedding lookups) still cut them, and the
    report says the layer count is uncertain."""
    doc = training_loop(iters=6, layers=6, moe_every=moe_every, seed=3)
    d = _d(write(doc, tmp_path / "train.json"))
    assert _counts(d) == {"training": 6} and d["steps"]["source"] == "anchor_optimizer_step"
    busy = Counter()  # the generator's GPU time per iteration (its kernels never overlap): off by one kernel, off
    for e in doc["traceEvents"]:  # by 2 us at least
        if e.get("cat") == "kernel":
            busy[e["args"]["tracegen_iteration"]] += e["dur"] / 1000
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx([busy[i] for i in range(6)], abs=1e-3)
    assert d["layers"] == 6
    uncertain = [w for w in d["warnings"] if "layer count is uncertain" in w]
    assert len(uncertain) == (moe_every == 2)


@pytest.mark.parametrize("kept", [1.0, 0.25, 0.5, 0.75, 0.9])
def test_a_file_cut_inside_a_graph_replay_leaves_that_replay_out(tmp_path, kept):
    """A file cut short (Kineto writes the host side first, then the GPU side by time) whose last CUDA graph replay
    kept only its first kernels: that forward is partial and left out, the whole ones before it are the steps."""
    doc = kineto_order(engine_forwards(forwards=8, layers=8, graph="full", batch=4))
    events = doc["traceEvents"]
    host = sum(e.get("cat") in ("cpu_op", "user_annotation") for e in events)
    events = events[:host + int((len(events) - host) * kept)]
    in_file = Counter(e["args"]["tracegen_forward"] for e in events if e.get("cat") == "kernel")
    in_all = Counter(e["args"]["tracegen_forward"] for e in doc["traceEvents"] if e.get("cat") == "kernel")
    whole = [f for f in sorted(in_all) if in_file[f] == in_all[f]]
    partial = [f for f in in_file if 0 < in_file[f] < in_all[f]]
    d = _d(write(doc | {"traceEvents": events}, tmp_path / "cut.json"))
    assert _counts(d) == {"decode": len(whole)} and d["steps"]["source"] == "graph_launch"
    assert d["steps"]["dropped_partial"] == len(partial) == (kept < 1)


def _launch_records_after_their_first_kernels(events: list[dict]) -> list[dict]:
    """Kineto writes its activity buffers as they fill, not in time order: a graph launch's record, written when the
    call returns, may come after the first kernels the replay ran. Each cudaGraphLaunch record moved past half of its
    replay's GPU activities."""
    out = [e for e in events if e.get("name") != "cudaGraphLaunch"]
    for rec in (e for e in events if e.get("name") == "cudaGraphLaunch"):
        mine = [i for i, e in enumerate(out) if e.get("cat") in GPU_CATS
                and e["args"]["correlation"] == rec["args"]["correlation"]]
        out.insert(mine[len(mine) // 2] + 1, rec)
    return out


@pytest.mark.parametrize("kept", [0.3, 0.55, 0.8])
def test_a_file_cut_inside_a_replay_whose_launch_record_it_lost_leaves_that_replay_out(tmp_path, kept):
    """The cut keeps the first kernels of a replay but not its launch record (written after them): those kernels share
    the replay's correlation id, which no eager launch does, so they are that replay's, cut short, and not work of
    the forward before it. The steps are exactly the whole forwards, each with exactly its own kernels."""
    doc = kineto_order(engine_forwards(forwards=8, layers=8, graph="full", batch=4))
    events = doc["traceEvents"]
    host = sum(e.get("cat") in ("cpu_op", "user_annotation") for e in events)
    ordered = events[:host] + _launch_records_after_their_first_kernels(events[host:])
    keep = int((len(events) - host) * kept)
    truth_all, truth_kept = _forward_kernels(events), _forward_kernels(ordered[:host + keep])
    whole = [f for f in sorted(truth_all) if truth_kept.get(f) == truth_all[f]]
    partial = [f for f in truth_kept if truth_kept[f] != truth_all[f]]
    assert len(partial) == 1 and whole  # the cut fell inside a replay
    path = tmp_path / "cut.json"
    path.write_bytes(_cut_text(doc, keep, ordered))
    steps, kernels = _steps_of(path)
    assert kernels == [truth_all[f] for f in whole] and steps.source == "graph_launch"
    d = _d(path)
    assert _counts(d) == {"decode": len(whole)} and d["steps"]["dropped_partial"] == 1


@pytest.mark.parametrize("keep,whole", [("inside", 0), ("one", 1)])
def test_a_cut_file_whose_records_begin_late_counts_no_step_before_them(tmp_path, keep, whole):
    """A cut file whose activity records begin late in the window (its later buffers written first): the training
    iterations before the first record kept have their CPU ops but none of their launches or kernels, so they are
    not whole, however early they end; only an iteration whose every launch and kernel the file holds is a step."""
    doc = kineto_order(training_loop(iters=4, layers=6, profiler_steps=True, seed=1))
    events = doc["traceEvents"]
    host = sum(e.get("cat") in ("cpu_op", "user_annotation") for e in events)
    tail = events[host:]

    def launches(it: int) -> list[int]:
        return [e["args"]["correlation"] for e in tail if e.get("cat") == "kernel"
                and e["args"]["tracegen_iteration"] == it]

    # The file keeps the launches (records and kernels) of the first half of iteration 2, or of all of it and the first
    # half of iteration 3, and lost those of iterations 0 and 1, written after them.
    second, third = launches(2), launches(3)
    kept_ids = set(second[:len(second) // 2] if keep == "inside" else second + third[:len(third) // 2])
    kept = [e for e in tail if e["args"].get("correlation") in kept_ids]
    path = tmp_path / "cut.json"
    path.write_bytes(_cut_text(doc, len(kept), events[:host] + kept + [e for e in tail if e not in kept]))
    if not whole:
        with pytest.raises(UserError, match="no step ends before the cut"):
            analyze_path(path)
        return
    d = _d(path)
    assert _counts(d) == {"training": 1}
    busy = sum(e["dur"] for e in tail if e.get("cat") == "kernel" and e["args"]["tracegen_iteration"] == 2) / 1000
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx([busy], abs=1e-3)


def _steps_of(path):
    """The steps as the steps stage finds them, each as the correlation ids of its GPU activities."""
    trace = load_trace(path)
    steps = find_steps(trace, link(trace))
    return steps, [sorted(trace.gpu.correlation[s.rows].tolist()) for s in steps.steps]


def _forward_kernels(events: list[dict]) -> dict[int, list[int]]:
    """The generator's truth: the correlation ids of each forward's kernels among `events`."""
    out: dict[int, list[int]] = {}
    for e in events:
        if e.get("cat") in GPU_CATS:
            out.setdefault(e["args"]["tracegen_forward"], []).append(e["args"]["correlation"])
    return {f: sorted(c) for f, c in out.items()}


@pytest.mark.parametrize("form", ["text", "events", "records_lost"])
@pytest.mark.parametrize("seed,moe_from,item", [(0, 1, False), (1, 1, True), (2, 3, False)])
@pytest.mark.parametrize("kept", [0.25, 0.6, 0.9, 1.0])
def test_a_file_cut_short_with_eager_moe_keeps_exactly_its_whole_forwards(tmp_path, kept, seed, moe_from, item,
                                                                           form):
    """Eager MoE forwards (a different number of kernels each) in Kineto's order, the file ending after `kept` of its
    GPU-side events: its JSON text cut inside the next event (`text`), or its events ending early (`events`; in
    `records_lost` the launch records of the last 40 kernels it keeps are lost too, their kernels tied to their ops by
    External id). Every forward whose kernels are all in the file is a step with exactly those kernels, and no other:
    the one the cut falls in is left out as partial with a warning, and nothing after it is a step."""
    doc = kineto_order(engine_forwards(forwards=8, layers=8, moe_from=moe_from, batch=4, seed=seed, item=item))
    events = doc["traceEvents"]
    host = sum(e.get("cat") in ("cpu_op", "user_annotation") for e in events)
    keep = int((len(events) - host) * kept)
    if form == "text" and kept < 1:
        path = tmp_path / "cut.json"
        path.write_bytes(_cut_text(doc, keep))
    elif form == "records_lost":
        kernels = [e["args"]["correlation"] for e in events[:host + keep] if e.get("cat") in GPU_CATS][-40:]
        lost = {id(e) for e in events if e.get("cat") == "cuda_runtime" and e["args"]["correlation"] in kernels}
        path = write(doc | {"traceEvents": [e for e in events[:host + keep] if id(e) not in lost]}, tmp_path / "c.json")
    else:
        path = write(doc | {"traceEvents": events[:host + keep]}, tmp_path / "cut.json")
    everything, in_file = _forward_kernels(events), _forward_kernels(events[:host + keep])
    whole = [everything[f] for f in sorted(everything) if in_file.get(f) == everything[f]]
    partial = [f for f in in_file if in_file[f] != everything[f]]
    assert whole and len(partial) == (kept < 1)  # the cut falls inside a forward
    steps, kernels = _steps_of(path)
    assert kernels == whole  # the whole forwards, each with exactly its kernels, in order
    assert steps.dropped_partial == len(partial)
    d = _d(path)
    assert _counts(d) == {"decode": len(whole)} and d["layers"] == 8
    assert any("left out as partial" in w for w in d["warnings"]) == bool(partial)


def test_every_forward_begins_with_its_input_preparation(tmp_path):
    """Cut at the embedding lookups, a forward still begins with the kernels its host launched after the forward
    before it sampled (its inputs' preparation), as an engine's step does: the generator's forwards, kernel for
    kernel, in one graph-less eager stack and one whose sampling the host waits for."""
    for item in (False, True):
        doc = engine_forwards(forwards=6, layers=6, moe_from=2, batch=2, seed=5, item=item)
        steps, kernels = _steps_of(write(doc, tmp_path / "eager.json"))
        assert steps.source == "anchor_embedding"
        truth = _forward_kernels(doc["traceEvents"])
        assert kernels == [truth[f] for f in sorted(truth)]


def _iteration_truth(events: list[dict]) -> tuple[list[list[int]], list[float]]:
    """The generator's truth per training iteration: its GPU activities' correlation ids and its GPU time in ms."""
    kernels: dict[int, list[int]] = {}
    busy: Counter = Counter()
    for e in events:
        if e.get("cat") in GPU_CATS:
            kernels.setdefault(e["args"]["tracegen_iteration"], []).append(e["args"]["correlation"])
            busy[e["args"]["tracegen_iteration"]] += e["dur"] / 1000
    return [sorted(kernels[i]) for i in sorted(kernels)], [busy[i] for i in sorted(kernels)]


@pytest.mark.parametrize("moe_every", [None, 2])
@pytest.mark.parametrize("optimizer_marks", [True, False])
@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_gradient_accumulation_iterations_are_cut_at_their_optimizer_steps(tmp_path, micro_batches, optimizer_marks,
                                                                           moe_every):
    """A training loop that accumulates gradients over micro-batches (zero_grad, micro_batches x (forward, backward),
    one fused AdamW step), with or without `Optimizer.step#` annotations (the fused update ops are the anchor then),
    dense or with MoE layers between dense ones: one iteration per optimizer step, each with exactly its kernels
    (all its micro-batches and its optimizer step), its GPU time the generator's, and the micro-batches named."""
    doc = training_loop(iters=5, layers=6, moe_every=moe_every, optimizer_marks=optimizer_marks, seed=3,
                        micro_batches=micro_batches)
    path = write(doc, tmp_path / "accumulate.json")
    kernels, busy = _iteration_truth(doc["traceEvents"])
    steps, found = _steps_of(path)
    assert found == kernels
    d = _d(path)
    assert _counts(d) == {"training": 5} and d["steps"]["source"] == "anchor_optimizer_step"
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx(busy, abs=1e-3)  # a kernel is 1 us at least
    assert d["layers"] == 6
    named = f"gradient accumulation over {micro_batches} micro-batches"
    assert (named in d["steps"]["source_detail"]) == (micro_batches > 1)


@pytest.mark.parametrize("optimizer_marks", [True, False])
@pytest.mark.parametrize("micro_batches", [1, 4])
def test_gradient_accumulation_under_profiler_steps_reads_one_iteration_per_step(tmp_path, micro_batches,
                                                                                  optimizer_marks):
    """prof.step() once per optimizer step: each ProfilerStep is one iteration with all its micro-batches."""
    doc = training_loop(iters=5, layers=6, moe_every=2, optimizer_marks=optimizer_marks, seed=4,
                        micro_batches=micro_batches, profiler_steps=True)
    path = write(doc, tmp_path / "profiled.json")
    kernels, busy = _iteration_truth(doc["traceEvents"])
    assert _steps_of(path)[1] == kernels
    d = _d(path)
    assert _counts(d) == {"training": 5} and d["steps"]["source"] == "profiler_step"
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx(busy, abs=1e-3)


@pytest.mark.parametrize("moe_every", [None, 2])
@pytest.mark.parametrize("micro_batches", [1, 4])
def test_a_capture_inside_an_accumulating_iteration_leaves_it_out(tmp_path, micro_batches, moe_every):
    """The capture began in the last micro-batch's backward of the first iteration and ended before the last one's
    optimizer step (no annotations): those two are partial, the four between them whole, each with its kernels."""
    doc = training_loop(iters=6, layers=6, moe_every=moe_every, optimizer_marks=False, seed=3,
                        micro_batches=micro_batches)

    backward = {e["args"]["External id"] for e in doc["traceEvents"] if e["args"]["tracegen_iteration"] == 0
                and e["args"].get("tracegen_micro_batch") == micro_batches - 1 and e.get("tid") == 2}

    def kept(e: dict) -> bool:
        it, mb = e["args"]["tracegen_iteration"], e["args"].get("tracegen_micro_batch")
        if it == 0:  # from the last micro-batch's backward (its ops on the autograd thread, their launches) on
            return mb is None or e["args"].get("External id", e["args"].get("correlation")) in backward
        return it < 5 or mb is not None  # the last iteration without its optimizer step
    events = [e for e in doc["traceEvents"] if kept(e)]
    assert sum(e.get("cat") == "kernel" and e["args"]["tracegen_iteration"] == 0 for e in events) > 2 * 6
    path = write(doc | {"traceEvents": events}, tmp_path / "window.json")
    kernels, busy = _iteration_truth(events)
    steps, found = _steps_of(path)
    assert found == kernels[1:5] and steps.dropped_partial == 2
    d = _d(path)
    assert _counts(d) == {"training": 4}
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx(busy[1:5], abs=1e-3)


@pytest.mark.parametrize("markers", ["gpu", "cpu", None])
def test_learned_positions_are_a_second_lookup_of_the_same_forward(tmp_path, markers):
    """OPT and GPT-2 look up learned position embeddings a few launches after the token embeddings: one forward, in
    a ProfilerStep window holding just that forward as in a trace without marks (two lookups in one window were read
    as two forwards: 12 steps for 6). Each step holds exactly its forward's kernels: the generator leaves 200 us
    between forwards and 1 us between a forward's kernels."""
    from tracegen import decode_loop

    doc = decode_loop(steps=6, layers=4, markers=markers, positions=True)
    kernels = sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "kernel")
    busy, last_end = [], None
    for ts, dur in kernels:
        if last_end is None or ts - last_end > 100:
            busy.append(0.0)
        busy[-1] += dur / 1e3
        last_end = ts + dur
    d = _d(write(doc, tmp_path / "t.json"))
    assert _counts(d) == {"decode": 6} and d["layers"] == 4 and d["steps"]["dropped_partial"] == 0
    assert [r["gpu_busy_ms"] for r in d["step_rows"]] == pytest.approx(busy, abs=1e-6) and len(busy) == 6


def test_a_cut_file_with_one_prefill_and_one_decode_of_an_eager_moe():
    """A real eager-MoE trace (DeepSeek-V2 layout: 2 dense layers, then 4 MoE layers; batch 2) cut inside its third
    forward: a prefill and one decode keep every kernel (the generator's truth). The prefill routes its 16 x 2
    tokens to every expert and its expert loop read as 25 layers; with one decode nothing tells which names vary
    from step to step, and the decode read 14. The names that counted the decode's 6 layers run once per layer in
    the prefill too, so the forwards hold; and the decode's layers are counted without the names whose counts differ
    between the two phases, where that counts fewer layers that the prefill runs alike."""
    base = Path(__file__).parent / "fixtures" / "traces" / "cuts" / "deepseek_v2_cut_prefill_decode"
    truth = json.loads(base.with_suffix(".truth.json").read_text())
    d = _d(base.with_suffix(".json.gz"))
    assert _counts(d) == truth["steps"] == {"prefill": 1, "decode": 1}
    assert d["layers"] == truth["layers"] == 6


def test_a_decode_the_launches_tell_from_the_prefill_is_a_decode():
    """A real eager Qwen3.5-MoE capture (a hand-written loop at batch 1, no op shapes) cut after its second forward:
    a prefill and one decode (the generator's truth). Their launches are unlike, and the decode's launch the fewer
    thread blocks, so the launches say which is which; the decode, whose host work ran longer than the prefill's,
    had been read as a prefill by its kernel mix and wall time, the test for steps no launch tells apart."""
    base = Path(__file__).parent / "fixtures" / "traces" / "cuts" / "qwen3_5_moe_cut_prefill_decode"
    truth = json.loads(base.with_suffix(".truth.json").read_text())
    d = _d(base.with_suffix(".json.gz"))
    assert _counts(d) == truth["steps"] == {"prefill": 1, "decode": 1}
    assert d["layers"] == truth["layers"] == 8


def test_a_cut_files_lost_forwards_tell_which_kernels_an_expert_loop_runs():
    """A real capture (an H100, the generator's truth) of ZAYA1 (convolutional attention, an eager top-1 MoE) with a
    ProfilerStep a decode, cut after two of its five decodes. The two kept decodes routed their tokens alike, so
    their expert loops ran as often and nothing in their kernels told them from per-layer work: a gather of the
    expert loop, in 5 of the 6 layers, read as a second kind of mixer (11 layers). The file still holds every host
    op of the three decodes whose kernels it lost, and there the expert loop's ops run more often: their kernels
    count no layers."""
    base = Path(__file__).parent / "fixtures" / "traces" / "cuts" / "zaya_cut_two_decodes"
    truth = json.loads(base.with_suffix(".truth.json").read_text())
    d = _d(base.with_suffix(".json.gz"))
    assert _counts(d) == truth["steps"] == {"decode": 2}
    assert d["layers"] == truth["layers"] == 6
    assert _kinds(d) == truth["layer_kinds"] == [6]


@pytest.mark.parametrize("name", ["seed_oss_reduce_overhead_cut_prefill_decode",
                                  "seed_oss_reduce_overhead_cut_mid_replay"])
def test_an_eager_prefill_before_decodes_replayed_from_cuda_graphs_is_a_forward_of_its_own(name):
    """Real captures (an H100, the generator's truth) of a hand loop over torch.compile(mode="reduce-overhead"): the
    prefill runs eagerly, each decode replays a CUDA graph tree. Cut after two forwards, or inside the fourth: with
    few replays, the eager prefill was taken with the first replay as one forward (1 prefill of 2 layers and no
    decode; P1 for P1 D2). Eager work before the first replay as long as half a replay's is a forward of its own."""
    base = Path(__file__).parent / "fixtures" / "traces" / "cuts" / name
    truth = json.loads(base.with_suffix(".truth.json").read_text())
    d = _d(base.with_suffix(".json.gz"))
    assert _counts(d) == truth["steps"]
    assert d["layers"] == truth["layers"] == 6


def test_a_capture_of_a_prefill_and_one_decode_of_an_eager_moe_keeps_both():
    """A whole capture of two forwards of an eager DeepSeek-V2 stack (real H100 kernels; the generator's truth: a
    prefill and a decode, 6 layers). Its prefill's expert loop reads as 25 layers, its decode 6, and no forward
    between them tells which count is the forwards': the decode, last, was dropped as a forward the capture ended
    inside. It runs kernels the prefill never runs (its own attention and GEMM tiles): another phase, not cut."""
    base = Path(__file__).parent / "fixtures" / "traces" / "deepseek_v2_prefill_and_one_decode"
    truth = json.loads(base.with_suffix(".truth.json").read_text())
    d = _d(base.with_suffix(".json.gz"))
    assert _counts(d) == truth["steps"] == {"prefill": 1, "decode": 1}
    assert d["layers"] == truth["layers"] == 6
    assert d["steps"]["dropped_partial"] == 0


@pytest.mark.parametrize("record_shapes", [False, True])
def test_a_vlm_prefill_with_a_vision_tower_on_the_llms_kernels(record_shapes, tmp_path):
    """Two generate calls of a VLM whose prefill runs 8 vision blocks on the LLM's own kernels (norm, attention, MLP)
    over 256 image patches before its 4 layers over the prompt: the prefill runs every per-layer name 12 times, the
    decodes 4. The prefill's extra runs are on other launch grids, as deep as one another: a second stack over other
    tokens, not more layers. Each forward is a step, by the generator's phase, with its own kernels; 4 layers (a
    draft-model reading, the decodes as drafts between prefills, is not taken either: the prefill's layers are not
    one stack)."""
    doc = generate_loop(forwards=6, layers=4, generations=2, vision_blocks=8, record_shapes=record_shapes)
    d = _d(write(doc, tmp_path / "vlm.json"))
    truth = generate_loop_truth(forwards=6, generations=2)
    assert _counts(d) == {"prefill": truth.count("prefill"), "decode": truth.count("decode")} == {"prefill": 2,
                                                                                                "decode": 10}
    assert d["layers"] == 4
    trace = load_trace(tmp_path / "vlm.json")
    steps = find_steps(trace, link(trace)).steps
    assert [s.kind for s in steps] == truth
    assert [len(s.rows) for s in steps] == _kernels_per_forward(doc)


@pytest.mark.parametrize("record_shapes", [False, True])
def test_a_shallow_vision_tower_in_a_later_generation_is_no_data_dependence(record_shapes, tmp_path):
    """Two generate calls of a VLM with 8 layers whose prefill runs only 2 vision blocks: the second generation's
    prefill, inside the trace, runs every per-layer name 10 times against the decodes' 8 and is hardly longer than
    them. It runs more of every name the forwards repeat, so it says nothing of which names vary with the data (an
    eager MoE's expert loop varies its experts' names only): every forward a step, by the generator's phase, with its
    own kernels, and 8 layers, with no doubt about them."""
    kw = dict(forwards=12, layers=8, batch=2, attention="sdpa", logits="last", generations=2, vision_blocks=2)
    doc = generate_loop(**kw, record_shapes=record_shapes)
    d = _d(write(doc, tmp_path / "vlm.json"))
    assert d["layers"] == 8
    assert not [w for w in d["warnings"] if "layer count is uncertain" in w]
    trace = load_trace(tmp_path / "vlm.json")
    steps = find_steps(trace, link(trace)).steps
    assert [s.kind for s in steps] == generate_loop_truth(**kw)
    assert [len(s.rows) for s in steps] == _kernels_per_forward(doc)


@pytest.mark.parametrize("patches", [256, 1024])
def test_a_short_vlm_capture_keeps_its_prefill(tmp_path, patches):
    """A VLM generate of 3 forwards: the prefill runs 2 vision blocks before its 8 layers, then 2 decodes. With one
    interior forward, the prefill and the first decode are what tells the data-dependent names: the prefill runs
    more of every repeated name than the decode, a second stack, not data dependence. The prefill is a whole step
    (it read 10 layers and was left out as a forward the capture began inside): the generator's 3 phases, 8 layers."""
    kw = dict(forwards=3, layers=8, prompt=16, batch=2, attention="sdpa", vision_blocks=2, patches=patches)
    doc = generate_loop(**kw)
    trace = load_trace(write(doc, tmp_path / "vlm3.json"))
    steps = find_steps(trace, link(trace))
    assert [s.kind for s in steps.steps] == generate_loop_truth(**kw) == ["prefill", "decode", "decode"]
    assert steps.dropped_partial == 0
    assert [len(s.rows) for s in steps.steps] == _kernels_per_forward(doc)
    assert _d(tmp_path / "vlm3.json")["layers"] == 8


def test_a_vision_tower_in_the_first_of_forwards_without_a_cache_counts_no_layers(tmp_path):
    """A VLM loop without a KV cache: every forward a prefill of the sequence so far, the first also running 2 vision
    blocks on the layers' kernels. The layers are read over the prefills: the first runs every per-layer name twice
    more, which is no data-dependent launch: 4 layers (the generator's), every forward a step."""
    kw = dict(forwards=8, layers=4, kv_cache=False, vision_blocks=2)
    doc = generate_loop(**kw)
    d = _d(write(doc, tmp_path / "vlm_nocache.json"))
    assert _counts(d) == {"prefill": generate_loop_truth(**kw).count("prefill")} == {"prefill": 8}
    assert d["layers"] == 4


def test_a_vlm_whose_vision_tower_launches_like_its_layers_keeps_its_decodes(tmp_path):
    """The VLM again, its 16 image patches as many rows as its 16-token prompt: the vision blocks launch on the
    layers' grids, so the prefill looks like one 10-layer stack and the 6-layer decodes like a draft model's forwards
    between prefills. The attention's shapes say the prefills each start afresh (keys no more than queries): no
    served model continuing its sequence past drafts. Every forward is a step, by the generator's phase."""
    doc = generate_loop(forwards=6, layers=6, generations=2, vision_blocks=4, patches=16, record_shapes=True,
                        attention="sdpa")
    trace = load_trace(write(doc, tmp_path / "vlm_equal_grids.json"))
    steps = find_steps(trace, link(trace)).steps
    assert [s.kind for s in steps] == generate_loop_truth(forwards=6, generations=2)
    assert [len(s.rows) for s in steps] == _kernels_per_forward(doc)


def _shapes_only_in(doc: dict, forward: int) -> dict:
    """The trace with op shapes kept only on one forward's ops (record_shapes switched on for one step)."""
    events = [e | {"args": {k: v for k, v in e["args"].items() if k not in ("Input Dims", "Input type")}}
              if e.get("cat") == "cpu_op" and e["args"].get("tracegen_forward") != forward else e
              for e in doc["traceEvents"]]
    return doc | {"traceEvents": events}


@pytest.mark.parametrize("shapes,attention", [(True, "sdpa"), (True, "eager"), (False, "sdpa")])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_prefill_run_without_its_output_head_is_no_encoder(tmp_path, shapes, attention, batch):
    """A decoder-only hand loop whose prefill runs the model without its output head (no lm_head, no sampling),
    then decodes: a forward with no output right before one with an output, as an encoder before a decoder's first
    forward. The first decode continues the prefill's cache (op shapes), and both read as many layers (launches
    alone): no encoder, every forward a step (the generator's truth)."""
    doc = generate_loop(forwards=8, layers=4, record_shapes=shapes, attention=attention, batch=batch)
    first = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["args"].get("tracegen_forward") == 0]
    head = {e["args"]["External id"] for e in first[-2:]}  # forward 0's output head GEMM and its argmax
    assert [e["name"] for e in first[-2:]][-1] == "aten::argmax"
    doc = doc | {"traceEvents": [e for e in doc["traceEvents"] if e.get("args", {}).get("External id") not in head]}
    truth = generate_loop_truth(forwards=8)
    d = _d(write(doc, tmp_path / "no_head.json"))
    assert _counts(d) == {"prefill": truth.count("prefill"), "decode": truth.count("decode")} == {"prefill": 1,
                                                                                                   "decode": 7}
    assert "encoder" not in d["steps"]["source_detail"]


def test_op_shapes_on_one_forward_leave_the_others_outputs_to_their_sampling(tmp_path):
    """Op shapes recorded for one forward only: the output head is seen by its shapes there, and the other forwards'
    outputs by their sampling ops; none passes for an encoder (the generator's truth: a prefill, two decodes)."""
    from decodegap.steps.anchors import launch_times
    from decodegap.steps.classify import _outputs
    from decodegap.steps.step import Piece

    doc = _shapes_only_in(generate_loop(forwards=3, layers=4, record_shapes=True), forward=1)
    truth = generate_loop_truth(forwards=3)
    path = write(doc, tmp_path / "shapes_once.json")
    trace = load_trace(path)
    links = link(trace)
    steps = find_steps(trace, links).steps
    when = launch_times(trace, links)
    starts = [int(when[s.rows].min()) for s in steps] + [2**62]  # each forward's host time, up to the next one's
    pieces = [Piece(s.start_ns, s.end_ns, s.rows, host_span=(starts[i], starts[i + 1]))
              for i, s in enumerate(steps)]
    assert _outputs(pieces, trace, links) == [True, True, True]
    d = _d(path)
    assert _counts(d) == {"prefill": truth.count("prefill"), "decode": truth.count("decode")} == {"prefill": 1,
                                                                                                   "decode": 2}


@pytest.mark.parametrize("batch,prompt", [(1, 16), (4, 4)])
def test_an_extend_before_the_only_shaped_forward_keeps_every_phase(tmp_path, batch, prompt):
    """A prefill, an extend of 4 tokens, a decode, op shapes on the decode only: each forward a step of its phase
    (the generator's truth), the launches left as they read (no step joined, nothing to turn round)."""
    kw = dict(forwards=3, layers=4, prompt=prompt, batch=batch, record_shapes=True, extend=[4])
    d = _d(write(_shapes_only_in(generate_loop(**kw), forward=2), tmp_path / "extend.json"))
    truth = generate_loop_truth(**kw)
    assert truth == ["prefill", "prefill", "decode"]
    assert _counts(d) == {"prefill": 2, "decode": 1} and d["layers"] == 4
