"""Linking: GPU activity -> the runtime call that launched it (correlation) -> the CPU op it ran under
(External id). Under CUDA-graph replay the runtime call is the graph launch and no op launched the kernel
itself: such kernels are kept, marked as graph kernels, and grouped by their launch shape instead."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodegap.trace.tables import KERNEL, Trace

GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch")


@dataclass
class Links:
    runtime_idx: np.ndarray  # per GPU row: row in Trace.runtime, -1 none
    op_idx: np.ndarray  # per GPU row: row in Trace.cpu_ops, -1 none
    from_graph: np.ndarray  # bool per GPU row: launched by a CUDA/HIP graph replay
    replay: np.ndarray  # per GPU row: an id of the graph replay that ran it (-1 none)


def _lookup(keys: np.ndarray, table_keys: np.ndarray) -> np.ndarray:
    """Row of each key in table_keys (first match), -1 where absent or key < 0."""
    if not len(table_keys) or not len(keys):
        return np.full(len(keys), -1, dtype=np.int64)
    order = np.argsort(table_keys, kind="stable")
    sorted_keys = table_keys[order]
    pos = np.searchsorted(sorted_keys, keys)
    pos = np.clip(pos, 0, len(sorted_keys) - 1)
    found = (sorted_keys[pos] == keys) & (keys >= 0)
    return np.where(found, order[pos], -1)


def link(trace: Trace) -> Links:
    gpu, rt, ops = trace.gpu, trace.runtime, trace.cpu_ops
    runtime_idx = _lookup(gpu.correlation, rt.correlation)
    # Kernels usually carry their op's External id; fall back to the runtime call's.
    external = gpu.external_id.copy()
    has_rt = runtime_idx >= 0
    missing = (external < 0) & has_rt
    external[missing] = rt.external_id[runtime_idx[missing]]
    op_idx = _lookup(external, ops.external_id)
    graph_name_ids = [i for i, name in enumerate(trace.names) if name in GRAPH_LAUNCH_NAMES]
    replay = np.full(len(gpu), -1, dtype=np.int64)
    if graph_name_ids:
        by_graph = np.isin(rt.name_id[runtime_idx[has_rt]], graph_name_ids)
        replay[np.flatnonzero(has_rt)[by_graph]] = runtime_idx[has_rt][by_graph]
    orphans = _replays_without_launch(gpu.kind, gpu.correlation, has_rt)
    replay = np.where(orphans >= 0, len(rt.correlation) + orphans, replay)
    from_graph = replay >= 0
    # A graph kernel's "op" is whatever enclosed the replay call, not the op that recorded it: drop it.
    op_idx = np.where(from_graph, -1, op_idx)
    return Links(runtime_idx=runtime_idx, op_idx=op_idx, from_graph=from_graph, replay=replay)


def _replays_without_launch(kind: np.ndarray, correlation: np.ndarray, has_rt: np.ndarray) -> np.ndarray:
    """Per GPU row, a number for the replay it belongs to (-1 none) where the file lacks the launch call: a cut file
    (its runtime calls cut off with the CPU side, some of the replay's kernels kept) or a trace without runtime
    events. An eager launch runs one kernel under its correlation id; only a graph replay runs several under one
    (with its memcpy and memset nodes)."""
    free = (~has_rt) & (correlation > 0)
    _, inverse = np.unique(correlation[free], return_inverse=True)
    kernels = np.bincount(inverse, weights=(kind[free] == KERNEL).astype(np.float64))
    out = np.full(len(kind), -1, dtype=np.int64)
    shared = kernels[inverse] > 1
    out[np.flatnonzero(free)[shared]] = inverse[shared]
    return out
