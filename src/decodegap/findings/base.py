"""What detectors read (one rank's input, the ranks' summaries) and the helpers they share; the records they
return are in findings/records.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass



@dataclass(frozen=True)
class RankInput:
    """What a per-rank detector reads: one rank's breakdown and what the user said about the model. Built next to
    the rank's trace (in its worker), so `calls_in_each_step` may still look at the trace."""

    breakdown: object  # decodegap.breakdown.Breakdown
    has_gpu: bool
    geometry: object | None = None  # decodegap.model.ModelGeometry (--model)
    active_tokens: int | None = None  # batch x context, when given
    # Per decode step, how many GPU activities named like this ran; None when there are no per-step rows.
    calls_in_each_step: Callable[[str], list[int]] | None = None
    graph_launch_us: float | None = None  # median host time of one CUDA/HIP graph launch in the trace, if any


@dataclass(frozen=True)
class RanksInput:
    """What a cross-rank detector reads: the detailed (slowest) rank's breakdown and the per-rank summaries'
    numbers."""

    main: object  # Breakdown of the detailed rank
    device_name: str | None  # the GPU the detailed rank's trace names
    rank_count: int  # traces analyzed (ranks)
    world_sizes: list[int]  # the world sizes the traces' distributedInfo give
    collective_ms_by_rank: dict[int, float]  # collective time per step, per rank


@dataclass(frozen=True)
class StepContext:
    step_ms: float  # median decode step, GPU timeline
    gpu_ms: float  # GPU work per step
    active_tokens: int | None  # batch x context when the user gave a model and context


def step_context(b, active_tokens: int | None = None) -> StepContext | None:
    """The decode step a detector judges against (`b` a Breakdown); None without decode steps."""
    if not b.decode_count or b.step_ms.median <= 0:
        return None
    return StepContext(b.step_ms.median, b.gpu_ms_per_step, active_tokens)


def layer_multiple(calls_per_step: float, layers: int | None) -> int | None:
    """k when calls_per_step is k per layer (k = 1..4), allowing one extra call (a final norm, an lm_head)."""
    if not layers:
        return None
    for k in (1, 2, 3, 4):
        if abs(calls_per_step - k * layers) <= max(1.0, 0.02 * k * layers):
            return k
    return None
