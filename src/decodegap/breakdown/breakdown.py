"""Breakdown of the decode steps: wall time, GPU busy fraction, time per category and per kernel group,
calls per step, the inferred layer count, and the host-side picture (launch cost, idle gaps)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from decodegap.ops import shapes as shape_info
from decodegap.ops.categories import is_backward, CATEGORIES, categorize
from decodegap.steps.layer_kinds import LayerKind
from decodegap.steps.across_forwards import (
    data_dependent,
    data_independent,
    layers_beside_other_phases,
    without_second_stacks,
)
from decodegap.steps.layers import Layers, count_layers
from decodegap.steps.lost_forwards import varying_past_cut
from decodegap.steps.repetition import name_classes
from decodegap.steps.sequence_steps import idle_gaps_ns
from decodegap.steps.step import PHASES, Steps
from decodegap.trace.link import Links
from decodegap.trace.tables import GPU_KIND_NAMES, Trace, group_rows, unique

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "hipGraphLaunch")


@dataclass(frozen=True)
class Spread:
    median: float
    mean: float
    min: float
    max: float
    p90: float

    @classmethod
    def of(cls, values) -> Spread:
        a = np.asarray(values, dtype=np.float64)
        if not a.size:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(float(np.median(a)), float(a.mean()), float(a.min()), float(a.max()), float(np.percentile(a, 90)))


@dataclass(frozen=True)
class KernelGroup:
    name: str
    category: str
    calls_per_step: float
    ms_per_step: float
    share: float  # of the decode step's GPU time
    us_per_call: float
    op: str | None  # the CPU op that launched it (innermost), None under graph replay
    input_shapes: list | None  # [[shape, dtype], ...] from the op when recorded
    grid: str | None
    block: str | None
    from_graph: bool
    bytes_per_call: int | None
    bytes_source: str | None  # "shapes" | "launch" (elements from grid x block x per-thread work)
    elements_per_call: int | None

    @property
    def gbps(self) -> float | None:
        if not self.bytes_per_call or self.us_per_call <= 0:
            return None
        return self.bytes_per_call / (self.us_per_call * 1e3)


@dataclass(frozen=True)
class CategoryTime:
    name: str
    ms_per_step: float
    share: float  # of GPU time
    share_of_step: float  # of the step's wall time


@dataclass(frozen=True)
class HostGap:
    gap_us: float
    before: str  # the kernel the GPU waited after
    after: str  # the kernel that ended the wait


@dataclass
class Breakdown:
    decode_count: int
    prefill_count: int
    step_ms: Spread  # GPU-timeline wall time of one step of `phase`
    step_ms_each: list[float]
    prefill_ms_each: list[float]
    gpu_ms_per_step: float  # sum of GPU activity durations per step
    busy_ms_per_step: float  # union of GPU activity per step
    gpu_busy_fraction: float
    kernels_per_step: float
    launch_us_per_kernel: float | None  # host time of one launch call
    categories: list[CategoryTime]
    kernels: list[KernelGroup]
    layers: int | None
    layers_evidence: str
    longest_gaps: list[HostGap] = field(default_factory=list)
    phase: str = "decode"  # the phase whose steps the numbers describe (decode when the trace has any)
    counts: dict = field(default_factory=dict)  # steps per phase
    ms_each: dict = field(default_factory=dict)  # wall time of each step, per phase
    layer_kinds: list[LayerKind] = field(default_factory=list)
    layer_starts: tuple[int, ...] = ()  # positions in the typical step's rows where each layer begins
    layer_end: int = 0  # and where the last one ends (exclusive)
    typical_step: int | None = None  # index into the phase's steps of the step the layers were read from
    layer_kind_of: tuple[int, ...] = ()  # per layer of the typical step: index into layer_kinds (empty: one kind)


def busy_ns(ts: np.ndarray, end: np.ndarray, start: int, stop: int) -> int:
    if not len(ts):
        return 0
    # a step's rows come in start order (the GPU table is sorted, steps are ascending row sets)
    ts, end = np.clip(ts, start, stop), np.clip(end, start, stop)
    idle = idle_gaps_ns(ts, end).sum() + (ts[0] - start) + max(stop - int(np.maximum.accumulate(end)[-1]), 0)
    return int(stop - start - idle)


SAME_PHASE_STEPS = 16  # steps of the phase compared to tell data-independent kernels from per-expert launches


def _forward_part(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The rows of a training iteration before its first backward kernel."""
    backward = [is_backward(trace.names[i]) for i in trace.gpu.name_id[rows].tolist()]
    first = backward.index(True) if True in backward else len(rows)
    return rows[:first]


def infer_layers(trace: Trace, rows: np.ndarray, alike: list[np.ndarray] | None = None,
                 training: bool = False, others: list[np.ndarray] | None = None,
                 varying_on_host: set[int] = frozenset()) -> Layers:
    """The layers of one step, over kernel names normalised where compilers number them; `alike`: the rows of other
    steps of its phase, whose kernel counts tell the per-layer work from launches that depend on the data; `others`:
    steps of other phases, which tell it where the phase has one step (an eager MoE prefill routes its tokens to
    more experts, its per-layer work runs as often; a kind's names run in the same layers in every step);
    `varying_on_host`: kernel names (trace.names ids) that forwards a cut lost show to depend on the data
    (steps.lost_forwards)."""
    mapping, canonical = name_classes(trace.names)

    def seq(r: np.ndarray) -> np.ndarray:
        return mapping[trace.gpu.name_id[r].astype(np.int64)]

    if training:  # a training iteration runs every layer forward, then backward: count the forward's
        rows, alike = _forward_part(trace, rows), [_forward_part(trace, r) for r in alike or []]
        others = [_forward_part(trace, r) for r in others or []]
    # (a forward that also runs a second stack of blocks, a VLM prefill's vision tower, tells nothing of which names
    # vary with the data: every per-layer name runs more often there)
    stable = data_independent(without_second_stacks([seq(r) for r in alike])) if alike and len(alike) > 1 else None
    if stable is not None and varying_on_host:
        stable -= {int(mapping[n]) for n in varying_on_host}
    found = count_layers(seq(rows), canonical, stable)
    other = [seq(r) for r in others or []]
    if stable is None and other:
        return layers_beside_other_phases(seq(rows), other, canonical, found)
    if found.count is None and stable is not None:  # too few names run alike in every step: leave out the varying
        found = count_layers(seq(rows), canonical, varying=data_dependent([seq(r) for r in alike]))
    return found


def compute_breakdown(trace: Trace, links: Links, steps: Steps) -> Breakdown:
    if not trace.has_gpu:
        return compute_cpu_breakdown(trace, steps)
    gpu = trace.gpu
    phase = steps.main_phase
    decode = steps.of(phase)
    n = max(len(decode), 1)
    rows = np.concatenate([s.rows for s in decode]) if decode else np.empty(0, np.int64)
    dur = gpu.dur_ns
    total_gpu_ns = int(dur[rows].sum()) if len(rows) else 0
    wall = [s.wall_ns / 1e6 for s in decode]
    busy = [busy_ns(gpu.ts_ns[s.rows], gpu.end_ns[s.rows], s.start_ns, s.end_ns) / 1e6 for s in decode]
    busy_fraction = float(sum(busy) / sum(wall)) if sum(wall) > 0 else 0.0
    step_ms = Spread.of(wall)

    by_category, groups = _category_times_and_groups(trace, links, rows)
    kernels = [_group(trace, key, entry, n, total_gpu_ns, category) for key, entry, category in groups]
    kernels.sort(key=lambda k: -k.ms_per_step)
    categories = [
        CategoryTime(name, by_category[name] / 1e6 / n, by_category[name] / total_gpu_ns if total_gpu_ns else 0.0,
                     _share_of_step(by_category[name] / 1e6 / n, step_ms))
        for name in CATEGORIES if by_category[name]
    ]
    categories.sort(key=lambda c: -c.ms_per_step)

    typical = decode[len(decode) // 2] if decode else None
    spread = [decode[i].rows for i in np.linspace(0, len(decode) - 1, min(SAME_PHASE_STEPS, len(decode))).astype(int)]
    others = [s.rows for s in steps.steps if s.kind != phase][:SAME_PHASE_STEPS] if len(decode) == 1 else None
    lost = varying_past_cut(trace, links, spread) if decode else set()
    found = (infer_layers(trace, typical.rows, spread, training=steps.workload == "training", others=others,
                          varying_on_host=lost)
             if typical is not None else Layers(None, "no step"))
    return Breakdown(
        decode_count=len(steps.decode), prefill_count=len(steps.prefill), step_ms=step_ms, step_ms_each=wall,
        prefill_ms_each=[s.wall_ns / 1e6 for s in steps.prefill],
        gpu_ms_per_step=total_gpu_ns / 1e6 / n, busy_ms_per_step=float(np.median(busy)) if busy else 0.0,
        gpu_busy_fraction=busy_fraction, kernels_per_step=len(rows) / n,
        launch_us_per_kernel=_launch_cost_us(trace, links, rows), categories=categories, kernels=kernels,
        layers=found.count, layers_evidence=found.evidence, longest_gaps=_longest_gaps(trace, decode),
        phase=phase, counts=_counts(steps), ms_each=_ms_each(steps), layer_kinds=found.kinds,
        layer_starts=found.starts, layer_end=found.end, typical_step=len(decode) // 2 if decode else None,
        layer_kind_of=found.kind_of,
    )


def _sums(values: np.ndarray, inverse: np.ndarray, counts: np.ndarray) -> list[int]:
    """Per group (`inverse`: each value's group, `counts`: values per group): the sum of its values, as Python
    ints (exact whatever their size)."""
    if not len(values):
        return [0] * len(counts)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return np.add.reduceat(values[np.argsort(inverse, kind="stable")].astype(object), starts).tolist()


def _category_times_and_groups(trace: Trace, links: Links, rows: np.ndarray) -> tuple[Counter, list]:
    """GPU time per category over `rows`, and the kernel groups, in the order of their first row: each (key,
    [first row, calls, ns, from graph], category of its first row). A group is a kernel name with the launching op's
    name and input shapes when it recorded them, else with its grid, block and op name. Computed over columns: the
    same as reading row by row."""
    gpu, ops = trace.gpu, trace.cpu_ops
    name = gpu.name_id[rows].astype(np.int64)
    kind = gpu.kind[rows].astype(np.int64)
    dur = gpu.dur_ns[rows].astype(np.int64)
    op = links.op_idx[rows].astype(np.int64)
    launched = op >= 0
    op_name = np.full(len(rows), -1, dtype=np.int64)
    dims = np.zeros(len(rows), dtype=np.int64)  # ids into the op texts (distinct values: an id is its text)
    types = np.zeros(len(rows), dtype=np.int64)
    op_name[launched] = ops.name_id[op[launched]]
    dims[launched] = ops.input_dims.ids[op[launched]]
    types[launched] = ops.input_types.ids[op[launched]]
    texts = ops.input_dims.values
    has_shapes = np.fromiter(map(bool, texts), dtype=bool, count=len(texts))[dims]

    by_category: Counter = Counter()
    pair_first, pair_of, pair_counts = group_rows(name, kind)  # a category per (kernel name, kind of activity)
    categories = [categorize(trace.names[n], GPU_KIND_NAMES[k])
                  for n, k in zip(name[pair_first].tolist(), kind[pair_first].tolist(), strict=True)]
    for category, ns in zip(categories, _sums(dur, pair_of, pair_counts), strict=True):
        by_category[category] += ns

    key = (name, has_shapes, np.where(has_shapes, op_name, gpu.grid_id[rows]),
           np.where(has_shapes, dims, gpu.block_id[rows]), np.where(has_shapes, types, op_name))
    first, group_of, calls = group_rows(*key)
    ns = _sums(dur, group_of, calls)
    groups = []
    for g in np.argsort(first, kind="stable").tolist():
        row_i = int(first[g])
        n, shaped, a, b, c = (int(column[row_i]) for column in key)
        row = int(rows[row_i])
        group_key = (n, "op", a, texts[b], texts[c]) if shaped else (n, "launch", a, b, c)
        groups.append((group_key, [row, int(calls[g]), ns[g], bool(links.from_graph[row])],
                       categories[pair_of[row_i]]))
    return by_category, groups


def _share_of_step(ms_per_step: float, step_ms: Spread) -> float:
    """Of the mean step's wall time (the mean, as ms_per_step is one), at most 1: a category running on several
    streams at once can overlap itself."""
    return min(ms_per_step / step_ms.mean, 1.0) if step_ms.mean > 0 else 0.0


def _counts(steps: Steps) -> dict:
    return {p: len(steps.of(p)) for p in PHASES}


def _ms_each(steps: Steps) -> dict:
    return {p: [s.wall_ns / 1e6 for s in steps.of(p)] for p in PHASES}


def _group(trace: Trace, key: tuple, entry: list, n_steps: int, total_gpu_ns: int, category: str) -> KernelGroup:
    row, calls, dur_ns, from_graph = entry
    gpu, names = trace.gpu, trace.names
    name = names[key[0]]
    grid = trace.shapes[int(gpu.grid_id[row])] or None
    block = trace.shapes[int(gpu.block_id[row])] or None
    op_name, shapes_list = None, None
    bytes_per_call, bytes_source, elements = None, None, None
    if key[1] == "op":
        op_name = names[key[2]]
        tensors = shape_info.tensors(key[3], key[4])
        shapes_list = [[shape, dtype] for shape, dtype in tensors]
        moved = shape_info.bytes_moved(op_name, tensors)
        if moved is not None:
            bytes_per_call, bytes_source = moved, "shapes"
            elements = max(shape_info.numel(shape) for shape, _ in tensors)
    else:
        op_name = names[key[4]] if key[4] >= 0 else None
    if gpu.kind[row] != 0 and gpu.nbytes[row] > 0:  # memcpy / memset carry their payload
        bytes_per_call, bytes_source = int(gpu.nbytes[row]), "trace"
    if bytes_per_call is None and category in ("cast", "copy") and grid and block:
        elements = shape_info.elements_from_launch(name, grid, block)
        out_bytes = shape_info.output_dtype_bytes_from_name(name)
        if elements and out_bytes:
            # A cast's source dtype is not in the name: count it as 1 byte (the narrowest), so this is a floor.
            in_bytes = out_bytes if category == "copy" else 1
            bytes_per_call, bytes_source = elements * (in_bytes + out_bytes), "launch"
    return KernelGroup(
        name=name, category=category, calls_per_step=calls / n_steps, ms_per_step=dur_ns / 1e6 / n_steps,
        share=dur_ns / total_gpu_ns if total_gpu_ns else 0.0, us_per_call=dur_ns / 1e3 / calls, op=op_name,
        input_shapes=shapes_list, grid=grid, block=block, from_graph=from_graph, bytes_per_call=bytes_per_call,
        bytes_source=bytes_source, elements_per_call=elements,
    )


def _launch_cost_us(trace: Trace, links: Links, rows: np.ndarray) -> float | None:
    rt_rows = links.runtime_idx[rows]
    rt_rows = unique(rt_rows[rt_rows >= 0])
    if not len(rt_rows):
        return None
    launch_ids = [i for i, name in enumerate(trace.names) if name in LAUNCH_CALLS]
    mask = np.isin(trace.runtime.name_id[rt_rows], launch_ids)
    if not mask.any():
        return None
    return float(np.median(trace.runtime.dur_ns[rt_rows[mask]]) / 1e3)


def _longest_gaps(trace: Trace, decode, top: int = 5) -> list[HostGap]:
    gpu = trace.gpu
    found = []
    for step in decode:
        r = step.rows
        if len(r) < 2:
            continue
        gaps = idle_gaps_ns(gpu.ts_ns[r], gpu.end_ns[r])
        i = int(np.argmax(gaps))
        if gaps[i] > 0:
            before, after = trace.names[gpu.name_id[r[i - 1]]], trace.names[gpu.name_id[r[i]]]
            found.append(HostGap(float(gaps[i]) / 1e3, before, after))
    found.sort(key=lambda g: -g.gap_us)
    return found[:top]


def _self_times(trace: Trace, start_ns: int, end_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """CPU ops starting inside [start, end) and their self time (duration minus their direct children's), the
    way profilers attribute CPU time: aten::mm's own work, not the resolve_conj it calls."""
    ops = trace.cpu_ops
    inside = np.flatnonzero((ops.ts_ns >= start_ns) & (ops.ts_ns < end_ns))
    if not len(inside):
        return inside, np.empty(0, dtype=np.int64)
    order = inside[np.lexsort((-ops.dur_ns[inside], ops.ts_ns[inside], ops.tid[inside]))]
    ts, dur, tid = ops.ts_ns[order].tolist(), ops.dur_ns[order].tolist(), ops.tid[order].tolist()
    self_ns = list(dur)
    stack: list[int] = []  # open ops on the current thread, innermost last
    for i in range(len(order)):
        if stack and tid[stack[-1]] != tid[i]:
            stack.clear()
        while stack and ts[i] >= ts[stack[-1]] + dur[stack[-1]]:
            stack.pop()
        if stack:
            self_ns[stack[-1]] -= dur[i]
        stack.append(i)
    return order, np.maximum(np.asarray(self_ns, dtype=np.int64), 0)


def compute_cpu_breakdown(trace: Trace, steps: Steps) -> Breakdown:
    """For traces with no GPU activity (CPU runs, CPU-only captures): the same tables over CPU ops' self time."""
    from decodegap.ops.categories import categorize_cpu_op

    phase = steps.main_phase
    decode = steps.of(phase)
    n = max(len(decode), 1)
    ops = trace.cpu_ops
    groups: dict[tuple, list] = {}
    by_category: Counter = Counter()
    for step in decode:
        rows, self_ns = _self_times(trace, step.start_ns, step.end_ns)
        for i, own in zip(rows.tolist(), self_ns.tolist(), strict=True):
            key = (int(ops.name_id[i]), ops.input_dims[i], ops.input_types[i])
            entry = groups.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += own
    total_ns = sum(e[1] for e in groups.values())
    kernels = []
    for (name_id, dims, types), (calls, dur_ns) in groups.items():
        name = trace.names[name_id]
        tensors = shape_info.tensors(dims, types)
        category = categorize_cpu_op(name, [t for _, t in tensors])
        by_category[category] += dur_ns
        moved = shape_info.bytes_moved(name, tensors)
        kernels.append(KernelGroup(
            name=name, category=category, calls_per_step=calls / n, ms_per_step=dur_ns / 1e6 / n,
            share=dur_ns / total_ns if total_ns else 0.0, us_per_call=dur_ns / 1e3 / calls, op=name,
            input_shapes=[[s, d] for s, d in tensors] or None, grid=None, block=None, from_graph=False,
            bytes_per_call=moved, bytes_source="shapes" if moved is not None else None,
            elements_per_call=max((shape_info.numel(s) for s, _ in tensors), default=None),
        ))
    kernels.sort(key=lambda k: -k.ms_per_step)
    wall = [s.wall_ns / 1e6 for s in decode]
    step_ms = Spread.of(wall)
    categories = [CategoryTime(c, by_category[c] / 1e6 / n, by_category[c] / total_ns if total_ns else 0.0,
                               _share_of_step(by_category[c] / 1e6 / n, step_ms))
                  for c in CATEGORIES if by_category[c]]
    categories.sort(key=lambda c: -c.ms_per_step)
    layers, evidence = _cpu_layers(trace, decode) if decode else (None, "no step")
    if layers is None:
        layers, evidence = _layers_from_calls(kernels)
    return Breakdown(
        decode_count=len(steps.decode), prefill_count=len(steps.prefill), step_ms=step_ms, step_ms_each=wall,
        prefill_ms_each=[s.wall_ns / 1e6 for s in steps.prefill], gpu_ms_per_step=total_ns / 1e6 / n,
        busy_ms_per_step=total_ns / 1e6 / n, gpu_busy_fraction=0.0,
        kernels_per_step=sum(k.calls_per_step for k in kernels), launch_us_per_kernel=None,
        categories=categories, kernels=kernels, layers=layers, layers_evidence=evidence,
        phase=phase, counts=_counts(steps), ms_each=_ms_each(steps),
    )


def _cpu_layers(trace: Trace, steps: list) -> tuple[int | None, str]:
    """Layers of a CPU-only trace from its op sequence, as count_layers reads kernels: the ops that run equally often
    in every step and once per layer."""
    ops = trace.cpu_ops
    order = np.argsort(ops.ts_ns, kind="stable")
    ts = ops.ts_ns[order]

    def seq(step) -> np.ndarray:
        lo, hi = np.searchsorted(ts, [step.start_ns, step.end_ns], side="left")
        return ops.name_id[order[lo:hi]].astype(np.int64)

    picks = [steps[i] for i in np.linspace(0, len(steps) - 1, min(SAME_PHASE_STEPS, len(steps))).astype(int)]
    stable = data_independent([seq(s) for s in picks]) if len(picks) > 1 else None
    found = count_layers(seq(steps[len(steps) // 2]), trace.names, stable)
    return found.count, found.evidence.replace("kernels run", "CPU ops run")


def _layers_from_calls(kernels: list[KernelGroup]) -> tuple[int | None, str]:
    """Without a kernel sequence, the layer count is the calls-per-step value most op groups share (>= 2)."""
    counts = Counter(round(k.calls_per_step) for k in kernels if k.calls_per_step >= 2
                     and abs(k.calls_per_step - round(k.calls_per_step)) < 0.05)
    if not counts:
        return None, "no op repeats within a step"
    value, groups = max(counts.items(), key=lambda item: (item[1], item[0]))
    if groups < 3:
        return None, "no op repeats within a step"
    return value, f"{groups} CPU op groups run {value} times per step"
