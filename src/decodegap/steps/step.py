"""The steps' types: a step, the steps of a trace with the evidence that found them, and a piece (the
kernels of one forward before its phase is read)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from decodegap.steps.anchors import FAMILIES
from decodegap.steps.marks import StepMark
from decodegap.trace.tables import Trace, unique

PHASES = ("decode", "prefill", "mixed", "training")

# Stable ids of the evidence (docs/report-schema.md lists them).
SOURCES = ("profiler_step", "profiler_step_gpu", "profiler_step_cpu_only", "sglang_step", "vllm_execute",
           "graph_launch", *(f"anchor_{f}" for f in FAMILIES), "kernel_repetition", "whole_trace", "none")


@dataclass(frozen=True)
class Step:
    index: int
    kind: str  # phase: decode | prefill | mixed | training
    start_ns: int
    end_ns: int
    rows: np.ndarray  # rows of Trace.gpu in this step
    batch: int | None = None
    tokens: int | None = None
    label: str | None = None  # the annotation's name, when one delimited the step

    @property
    def phase(self) -> str:
        return self.kind

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Steps:
    steps: list[Step]
    source: str  # stable id, one of SOURCES
    detail: str = ""  # the evidence in words
    workload: str = "inference"  # or "training"
    dropped_partial: int = 0
    warnings: list[str] = field(default_factory=list)
    graph_launches: int = 0  # graph replays that hold the steps' kernels
    runtime: str = "CUDA"  # CUDA | HIP, from the launch calls

    def of(self, phase: str) -> list[Step]:
        return [s for s in self.steps if s.kind == phase]

    @property
    def decode(self) -> list[Step]:
        return self.of("decode")

    @property
    def prefill(self) -> list[Step]:
        return self.of("prefill")

    @property
    def main_phase(self) -> str:
        """The phase the breakdown describes: decode when there is any, else what the trace holds most of."""
        counts = Counter(s.kind for s in self.steps)
        if counts["decode"] or not counts:
            return "decode"
        return max(PHASES, key=lambda p: (counts[p], -PHASES.index(p)))


@dataclass
class Piece:
    start_ns: int
    end_ns: int
    rows: np.ndarray
    mark: StepMark | None = None
    whole: bool = False  # the evidence says it is a whole forward (its edges were checked against the window)
    host_span: tuple[int, int] | None = None  # the host time it covers, when the evidence says (anchor to anchor)
    encoder: bool = False  # an encoder's forward joined to the first decoder forward after it: the prefill


def runtime_of(trace: Trace) -> str:
    ids = unique(trace.runtime.name_id).tolist()
    return "HIP" if any(trace.names[i].startswith("hip") for i in ids) else "CUDA"

