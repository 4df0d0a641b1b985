"""Step annotations that profilers and engines write, parsed into what they say: the phase, the batch, the tokens.

Families, each a stable id used as `steps.<phase>.source`:
- `profiler_step`: torch.profiler's `ProfilerStep#N` (one per `prof.step()`) and decodegap record's own steps;
- `sglang_step`: SGLang's `step[DECODE bs=32]`, `step[EXTEND bs=15 toks=15360]`, `step[MIXED ...]`;
- `vllm_execute`: vLLM's `execute_<tokens>_context_<n>(<stats>)_generation_<m>(<stats>)`: n prefill and m decode
  requests in one forward."""

from __future__ import annotations

import re
from dataclasses import dataclass

from decodegap.trace.tables import Annotation

PROFILER_STEP = re.compile(r"^(?:ProfilerStep|decodegap[._ ]?step)\s*#\s*(\d+)$", re.IGNORECASE)
SGLANG_STEP = re.compile(r"^step\[([A-Za-z_]+)([^\]]*)\]$")
VLLM_EXECUTE = re.compile(r"^execute_(\d+)_context_(\d+)\(([^)]*)\)_generation_(\d+)\(([^)]*)\)$")
_KEY_VALUE = re.compile(r"(\w+)=(\d+)")
_QUERY_TOKENS = re.compile(r"^sq(\d+)")

# SGLang forward modes -> phase. Speculative verification runs several query tokens per request: mixed.
_SGLANG_PHASE = {"decode": "decode", "draft_decode": "decode", "extend": "prefill", "prefill": "prefill",
                 "draft_extend": "prefill", "mixed": "mixed", "target_verify": "mixed", "idle": None}

FAMILY_ORDER = ("sglang_step", "vllm_execute", "profiler_step")  # engines' own marks say more (phase, batch)


@dataclass(frozen=True)
class StepMark:
    family: str
    name: str
    ts_ns: int
    dur_ns: int
    on_gpu: bool
    phase: str | None = None  # decode | prefill | mixed, when the mark says
    batch: int | None = None  # requests in the forward
    tokens: int | None = None  # tokens the forward processes

    @property
    def end_ns(self) -> int:
        return self.ts_ns + self.dur_ns


def parse_mark(a: Annotation) -> StepMark | None:
    name = a.name.strip()
    if PROFILER_STEP.match(name):
        return StepMark("profiler_step", name, a.ts_ns, a.dur_ns, a.on_gpu)
    m = SGLANG_STEP.match(name)
    if m:
        mode = m.group(1).lower()
        fields = {k: int(v) for k, v in _KEY_VALUE.findall(m.group(2))}
        batch = fields.get("bs")
        phase = _SGLANG_PHASE.get(mode, "mixed")
        tokens = fields.get("toks", batch if phase == "decode" else None)
        return StepMark("sglang_step", name, a.ts_ns, a.dur_ns, a.on_gpu, phase, batch, tokens)
    m = VLLM_EXECUTE.match(name)
    if m:
        tokens, prefill_reqs, decode_reqs = int(m.group(1)), int(m.group(2)), int(m.group(4))
        phase = "mixed" if prefill_reqs and decode_reqs else "prefill" if prefill_reqs else "decode"
        return StepMark("vllm_execute", name, a.ts_ns, a.dur_ns, a.on_gpu, phase,
                        prefill_reqs + decode_reqs or None, tokens or _query_tokens(m.group(3), m.group(5)))
    return None


def _query_tokens(*stats: str) -> int | None:
    found = [int(m.group(1)) for s in stats if (m := _QUERY_TOKENS.match(s))]
    return sum(found) or None


def step_marks(annotations: list[Annotation]) -> dict[str, list[StepMark]]:
    """The step marks of each family, in time order, exact duplicates removed (some exporters write a mark twice)."""
    found: dict[str, dict[tuple, StepMark]] = {}
    for a in annotations:
        mark = parse_mark(a)
        if mark is not None:
            found.setdefault(mark.family, {}).setdefault((mark.name, mark.ts_ns, mark.dur_ns, mark.on_gpu), mark)
    return {family: sorted(marks.values(), key=lambda m: (m.ts_ns, m.dur_ns)) for family, marks in found.items()}
