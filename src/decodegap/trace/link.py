"""Linking: GPU activity -> the runtime call that launched it (correlation) -> the CPU op it ran under
(External id). Under CUDA-graph replay the runtime call is the graph launch and no op launched the kernel
itself: such kernels are kept, marked as graph kernels, and grouped by their launch shape instead."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodegap.trace.tables import Trace

GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch")


@dataclass
class Links:
    runtime_idx: np.ndarray  # per GPU row: row in Trace.runtime, -1 none
    op_idx: np.ndarray  # per GPU row: row in Trace.cpu_ops, -1 none
    from_graph: np.ndarray  # bool per GPU row: launched by a CUDA/HIP graph replay


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
    from_graph = np.zeros(len(gpu), dtype=bool)
    if graph_name_ids:
        from_graph[has_rt] = np.isin(rt.name_id[runtime_idx[has_rt]], graph_name_ids)
    # A graph kernel's "op" is whatever enclosed the replay call, not the op that recorded it: drop it.
    op_idx = np.where(from_graph, -1, op_idx)
    return Links(runtime_idx=runtime_idx, op_idx=op_idx, from_graph=from_graph)
