"""collective_bound: all-reduce / all-gather time that its message sizes do not explain, or ranks waiting
on a straggler. Message bytes come from the communication op's metadata or input shapes.

Rule: each collective group is expected to take latency + ring bytes / link bandwidth per call, at the figures of
the trace's GPU kind (its interconnect: NVLink, PCIe, xGMI; model/hardware.py; PCIe's when the GPU is unknown, the
slower and so the safer expectation). Fires when collectives take >= MIN_SHARE of GPU time AND their excess over
that expectation is >= MIN_EXCESS_SHARE of GPU time AND they take >= MIN_SLOWDOWN x the expectation: a large share
alone is what a small, well-behaved step looks like."""

from __future__ import annotations

from decodegap.errors import UserError
from decodegap.findings.base import RanksInput, step_context
from decodegap.findings.host_bound import rest_unchanged
from decodegap.findings.records import Finding, after_fix, make_finding
from decodegap.floor.hardware import DEFAULT_ALLREDUCE_US, get_gpu
from decodegap.ops.kernel_names import short_kernel_name

MIN_SHARE = 0.15  # of GPU time, for the latency-bound case
MIN_EXCESS_SHARE = 0.05  # of GPU time: time the collectives take beyond what their bytes need
MIN_SLOWDOWN = 2.0  # measured / expected, all collective groups together
PCIE_GBPS = 64.0  # per direction, per GPU: the link assumed when the trace names no known GPU
STRAGGLER_SPREAD = 0.2  # collective time differing by this share of the step between ranks

FIX_LATENCY = ("Collectives cost far more than their bytes: at decode batch sizes they are latency-bound. Use the "
               "engine's custom one-shot all-reduce (SGLang/vLLM custom_all_reduce, symmetric memory), fuse the "
               "all-reduce with the following norm, reduce TP degree for small models, or overlap communication "
               "with compute.")
FIX_STRAGGLER = ("Ranks wait inside collectives for the slowest rank: find what only that rank does (extra work, "
                 "a host stall, a slower GPU or link, CPU contention/pinning) and even it out.")


def _link(device_name: str | None) -> tuple[str, float, float]:
    """(interconnect, small-message latency in us, GB/s per direction) of the trace's GPU kind."""
    try:
        gpu = get_gpu(device_name or "")
    except UserError:
        return "pcie (GPU unknown)", DEFAULT_ALLREDUCE_US["pcie"], PCIE_GBPS
    return gpu.interconnect, gpu.default_allreduce_us, gpu.interconnect_gbps


def _world_size(ranks: RanksInput) -> int:
    return max([w for w in ranks.world_sizes if w] + [ranks.rank_count, 2])


def _message_bytes(k) -> int | None:
    if k.input_shapes:
        from decodegap.ops.shapes import tensor_bytes

        sizes = [tensor_bytes(s, d) for s, d in k.input_shapes]
        if sizes and all(v is not None for v in sizes):
            return sum(sizes)
    return None


def _by_rank(per_rank: dict[int, float]) -> dict[str, float]:
    """Per-rank figures keyed as JSON keys them (the rank as a string)."""
    return {str(rank): ms for rank, ms in per_rank.items()}


def detect(ranks: RanksInput) -> list[Finding]:
    b = ranks.main
    ctx = step_context(b)
    if ctx is None:
        return []
    groups = [k for k in b.kernels if k.category == "collective"]
    total_ms = sum(k.ms_per_step for k in groups)
    found = []
    per_rank = {rank: round(ms, 3) for rank, ms in ranks.collective_ms_by_rank.items()}
    if ranks.rank_count > 1 and total_ms > 0:
        low_rank = min(per_rank, key=per_rank.get)
        high_rank = max(per_rank, key=per_rank.get)
        spread = per_rank[high_rank] - per_rank[low_rank]
        if spread >= STRAGGLER_SPREAD * ctx.step_ms:
            ev = {"collective_ms_per_step_by_rank": _by_rank(per_rank), "straggler_rank": low_rank,
                  "max_wait_ms_per_step": round(spread, 3)}
            title = (f"Rank {low_rank} is the straggler: the other ranks spend up to {spread:.2f} ms more per step "
                     f"inside collectives waiting for it ({per_rank[low_rank]:.2f} ms on rank {low_rank} vs "
                     f"{per_rank[high_rank]:.2f} ms on rank {high_rank})")
            after = after_fix(ctx.step_ms - spread,
                             f"rank {low_rank}'s extra work evened out: no rank waits inside collectives for it "
                             f"(up to {spread:.3f} ms per step now); {rest_unchanged(b)}")
            found.append(make_finding("straggler_rank", title, spread, spread / ctx.step_ms, ev, FIX_STRAGGLER, after))
    if not groups or total_ms / max(ctx.gpu_ms, 1e-9) < MIN_SHARE:
        return found
    calls = sum(k.calls_per_step for k in groups)
    link, latency_us, gbps = _link(ranks.device_name)
    world = _world_size(ranks)
    ring = 2.0 * (world - 1) / world  # bytes each rank sends (and receives) per byte of a ring all-reduce
    detail = []
    excess_ms = expected_ms = 0.0
    for k in groups:
        nbytes = _message_bytes(k)
        expected_us = latency_us + (ring * nbytes / (gbps * 1e3) if nbytes else 0.0)
        detail.append({"kernel": short_kernel_name(k.name), "calls_per_step": round(k.calls_per_step, 2),
                       "us_per_call": round(k.us_per_call, 1), "bytes_per_call": nbytes,
                       "expected_us_per_call": round(expected_us, 1),
                       "slowdown": round(k.us_per_call / expected_us, 2)})
        excess_ms += max(k.us_per_call - expected_us, 0.0) * k.calls_per_step / 1e3
        expected_ms += expected_us * k.calls_per_step / 1e3
    ev = {"collective_ms_per_step": round(total_ms, 3), "calls_per_step": round(calls, 1),
          "us_per_call": round(total_ms * 1e3 / calls, 1) if calls else None, "groups": detail,
          "expected_ms_per_step": round(expected_ms, 3), "excess_ms_per_step": round(excess_ms, 3),
          "model": f"{latency_us:g} us + {ring:.2f} x bytes / {gbps:g} GB/s ({link}, {world} ranks)",
          "rule": (f"collectives >= {MIN_SHARE:.0%} of GPU time, excess over the model >= {MIN_EXCESS_SHARE:.0%} of "
                   f"GPU time and >= {MIN_SLOWDOWN:g}x the model's time")}
    if ranks.rank_count > 1:
        ev["collective_ms_per_step_by_rank"] = _by_rank(per_rank)
    if excess_ms < MIN_EXCESS_SHARE * ctx.gpu_ms or total_ms < MIN_SLOWDOWN * expected_ms:
        return found
    title = (f"Collectives take {total_ms:.2f} ms per step ({total_ms / ctx.gpu_ms:.0%} of GPU time): {calls:.0f} "
             f"calls at {ev['us_per_call']} us each, {excess_ms:.2f} ms more than their message sizes need")
    after = after_fix(ctx.step_ms - excess_ms,
                     f"each collective takes what its message needs ({ev['model']}): {expected_ms:.3f} ms per step "
                     f"of the {total_ms:.3f} ms measured; {rest_unchanged(b)}")
    found.append(make_finding("collective_bound", title, total_ms, total_ms / ctx.gpu_ms, ev, FIX_LATENCY, after))
    return found
