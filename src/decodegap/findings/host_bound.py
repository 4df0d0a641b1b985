"""host_bound: inside decode steps the GPU waits on the CPU (launch overhead, Python, synchronisation)."""

from __future__ import annotations

from decodegap.findings.base import RankInput, step_context
from decodegap.findings.records import AfterFix, Finding, after_fix, make_finding
from decodegap.ops.kernel_names import short_kernel_name

MAX_BUSY = 0.75  # GPU busy below this fraction of the step...
MIN_IDLE_MS = 0.2  # ...and idle for at least this long per step
# A graph launch's host time when the trace has neither a graph launch nor a kernel launch to measure it by (CUDA
# 12's cudaGraphLaunch of a decode-sized graph: a few microseconds to tens).
GRAPH_LAUNCH_US = 10.0

FIX = ("Launch fewer, larger kernels: capture the decode step in a CUDA graph (SGLang/vLLM do unless disabled; "
       "torch.compile(mode='reduce-overhead') or torch.cuda.CUDAGraph for a custom loop), fuse small ops "
       "(torch.compile, fused norm/rope/activation kernels), and remove host syncs (.item(), .cpu(), "
       "data-dependent shapes) from the step. Profiling inflates host time: compare with --tpot.")


def rest_unchanged(b) -> str:
    """How an estimate that takes GPU work out of the step treats the rest (`b` a Breakdown): unchanged; on a
    host-bound step that holds only once the host keeps up (the GPU then idles instead)."""
    if b.gpu_busy_fraction and b.gpu_busy_fraction < MAX_BUSY:
        return (f"the rest of the step unchanged, which on this host-bound step (GPU busy {b.gpu_busy_fraction:.0%}) "
                "holds once the host keeps up (host_bound fixed too)")
    return "the rest of the step unchanged" + (f" (GPU busy {b.gpu_busy_fraction:.0%})" if b.gpu_busy_fraction else "")


def detect(rank: RankInput) -> list[Finding]:
    b = rank.breakdown
    ctx = step_context(b, rank.active_tokens)
    if ctx is None or not rank.has_gpu:
        return []
    idle_ms = max(ctx.step_ms - b.busy_ms_per_step, 0.0)
    if b.gpu_busy_fraction >= MAX_BUSY or idle_ms < MIN_IDLE_MS:
        return []
    graph_share = sum(k.calls_per_step for k in b.kernels if k.from_graph) / max(b.kernels_per_step, 1)
    evidence = {
        "gpu_busy_fraction": round(b.gpu_busy_fraction, 4),
        "idle_ms_per_step": round(idle_ms, 3),
        "kernels_per_step": round(b.kernels_per_step, 1),
        "launch_us_per_kernel": round(b.launch_us_per_kernel, 2) if b.launch_us_per_kernel else None,
        "launch_ms_per_step": (round(b.launch_us_per_kernel * b.kernels_per_step / 1e3, 3)
                               if b.launch_us_per_kernel else None),
        "graph_replayed_fraction": round(graph_share, 3),
        "longest_gaps_us": [{"gap_us": round(g.gap_us, 1), "after": short_kernel_name(g.before),
                             "before": short_kernel_name(g.after)} for g in b.longest_gaps[:3]],
    }
    launches = (f"; {b.kernels_per_step:,.0f} launches per step at {b.launch_us_per_kernel:.1f} us each"
                if b.launch_us_per_kernel else f"; {b.kernels_per_step:,.0f} launches per step")
    title = (f"The GPU idles {idle_ms:.1f} ms of each {ctx.step_ms:.1f} ms step (busy {b.gpu_busy_fraction:.0%}): "
             f"the step is host-bound{launches}")
    if graph_share < 0.5:
        title += ", no CUDA graph"
    return [make_finding("host_bound", title, idle_ms, idle_ms / ctx.step_ms, evidence, FIX, _after_fix(rank))]


def _after_fix(rank: RankInput) -> AfterFix:
    """The step's GPU-busy time launched by one graph: the host gaps and per-kernel launches gone."""
    b = rank.breakdown
    if rank.graph_launch_us is not None:
        launch_us, measured = rank.graph_launch_us, "the trace's median graph launch"
    elif b.launch_us_per_kernel:
        launch_us, measured = b.launch_us_per_kernel, "the trace's median launch call"
    else:
        launch_us, measured = GRAPH_LAUNCH_US, "assumed: the trace has no launch call to measure"
    assumes = (f"the step's {b.busy_ms_per_step:.3f} ms of GPU work runs back to back from one graph launch "
               f"({launch_us:.1f} us, {measured}): no host gaps, no per-kernel launches")
    return after_fix(b.busy_ms_per_step + launch_us / 1e3, assumes)
