"""The Finding records every detector returns: one type per detector (the `id` is the tag), each with its typed
evidence (every field optional: a detector reports what it measured), the step once fixed (`after_fix`), and the
report's best case. These are the records the Analysis holds and the JSON report encodes."""

from __future__ import annotations

import math

import msgspec
from msgspec import UNSET, UnsetType

from decodegap.records import Struct


class Loose(Struct, omit_defaults=True):
    """Evidence: every field optional (a detector reports what it measured): absent stays absent, null stays null.
    Read by attribute (`ev.pool_slots`) or as the mapping the JSON holds (`ev["pool_slots"]`, `ev.items()`)."""

    def as_dict(self) -> dict:
        return msgspec.to_builtins(self)

    def __getitem__(self, key: str):
        value = self.as_dict()
        if key not in value:
            raise KeyError(key)
        return value[key]

    def __contains__(self, key: str) -> bool:
        return key in self.as_dict()

    def get(self, key: str, default=None):
        return self.as_dict().get(key, default)

    def items(self):
        return self.as_dict().items()

    def keys(self):
        return self.as_dict().keys()


Num = float | int


class CollectiveGroup(Loose):
    kernel: str | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    us_per_call: Num | None | UnsetType = UNSET
    bytes_per_call: int | None | UnsetType = UNSET
    expected_us_per_call: Num | None | UnsetType = UNSET
    slowdown: Num | None | UnsetType = UNSET


class CopyGroup(Loose):
    kernel: str | None | UnsetType = UNSET
    op: str | None | UnsetType = UNSET
    shapes: list | None | UnsetType = UNSET
    weight_shape: list | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    bytes_per_call: int | None | UnsetType = UNSET
    ms_per_step: Num | None | UnsetType = UNSET


class HostGapEvidence(Loose):
    gap_us: Num | None | UnsetType = UNSET
    before: str | None | UnsetType = UNSET
    after: str | None | UnsetType = UNSET


class KvPoolCastEvidence(Loose):
    kernel: str | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    layers: int | None | UnsetType = UNSET
    calls_per_layer: int | None | UnsetType = UNSET
    bytes_per_call: int | None | UnsetType = UNSET
    bytes_per_step: int | None | UnsetType = UNSET
    us_per_call: Num | None | UnsetType = UNSET
    gbps: Num | None | UnsetType = UNSET
    bytes_source: str | None | UnsetType = UNSET
    op: str | None | UnsetType = UNSET
    from_graph: bool | None | UnsetType = UNSET
    shape: list[int] | None | UnsetType = UNSET
    pool_slots: int | None | UnsetType = UNSET
    row_elements: int | None | UnsetType = UNSET
    dtype_from: str | None | UnsetType = UNSET
    dtype_to: str | None | UnsetType = UNSET
    elements_per_call: int | None | UnsetType = UNSET
    note: str | None | UnsetType = UNSET
    matches_model_kv_width: bool | None | UnsetType = UNSET
    model_kv_width: int | None | UnsetType = UNSET
    active_tokens: int | None | UnsetType = UNSET
    active_fraction: Num | None | UnsetType = UNSET
    bytes_needed_per_call: int | None | UnsetType = UNSET


class HostBoundEvidence(Loose):
    gpu_busy_fraction: Num | None | UnsetType = UNSET
    idle_ms_per_step: Num | None | UnsetType = UNSET
    kernels_per_step: Num | None | UnsetType = UNSET
    launch_us_per_kernel: Num | None | UnsetType = UNSET
    launch_ms_per_step: Num | None | UnsetType = UNSET
    graph_replayed_fraction: Num | None | UnsetType = UNSET
    longest_gaps_us: list[HostGapEvidence] | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET


class CollectiveEvidence(Loose):
    collective_ms_per_step: Num | None | UnsetType = UNSET
    calls_per_step: Num | None | UnsetType = UNSET
    us_per_call: Num | None | UnsetType = UNSET
    groups: list[CollectiveGroup] | None | UnsetType = UNSET
    expected_ms_per_step: Num | None | UnsetType = UNSET
    excess_ms_per_step: Num | None | UnsetType = UNSET
    model: str | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET
    collective_ms_per_step_by_rank: dict[str, Num] | None | UnsetType = UNSET  # by rank


class StragglerEvidence(Loose):
    collective_ms_per_step_by_rank: dict[str, Num] | None | UnsetType = UNSET  # by rank
    straggler_rank: int | None | UnsetType = UNSET
    max_wait_ms_per_step: Num | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET


class WeightCopyEvidence(Loose):
    bytes_per_step: int | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET
    shape_checked_against_model: bool | None | UnsetType = UNSET
    groups: list[CopyGroup] | None | UnsetType = UNSET
    left_out_as_activations: list[CopyGroup] | None | UnsetType = UNSET


class ProfilerEvidence(Loose):
    unprofiled_ms: Num | None | UnsetType = UNSET
    profiled_ms: Num | None | UnsetType = UNSET
    ratio: Num | None | UnsetType = UNSET
    source: str | None | UnsetType = UNSET
    rule: str | None | UnsetType = UNSET
    samples: int | None | UnsetType = UNSET
    unprofiled_p10_ms: Num | None | UnsetType = UNSET
    unprofiled_p90_ms: Num | None | UnsetType = UNSET
    spread_ms: Num | None | UnsetType = UNSET
    bimodal: bool | None | UnsetType = UNSET
    call_index: list[int] | None | UnsetType = UNSET
    samples_ms: list[Num] | None | UnsetType = UNSET


class AfterFix(Struct):
    """The step a finding leaves once fixed, from the trace's own numbers; `assumes` what that takes for granted
    (one line, with the figures)."""

    step_ms: float
    tokens_per_s: float  # per sequence, as the report's: 1000 / step_ms
    assumes: str


def after_fix(step_ms: float, assumes: str) -> AfterFix:
    step_ms = round(step_ms, 4)
    return AfterFix(step_ms=step_ms, tokens_per_s=round(tokens_per_s(step_ms), 3), assumes=assumes)


def tokens_per_s(step_ms: float) -> float:
    """One token per sequence per step."""
    return 1e3 / step_ms if step_ms > 0 else 0.0


class BestCase(Struct):
    """The step once the findings with an estimate are fixed, those whose fixes overlap a costlier one's left out:
    their savings added."""

    step_ms: float
    tokens_per_s: float
    findings: list[str]  # the findings whose savings were added
    assumes: str


class Finding(Struct, tag_field="id"):
    """A root cause; `id` (the tag) says which detector found it and so which evidence type it carries."""

    title: str
    ms_per_step: float
    share: float
    share_of: str
    fix: str
    after_fix: AfterFix | None = None  # None: no estimate (or a report from before there were any)

    @property
    def id(self) -> str:
        return type(self).__struct_config__.tag


class KvPoolCast(Finding, tag="kv_pool_cast", kw_only=True):
    evidence: KvPoolCastEvidence


class HostBound(Finding, tag="host_bound", kw_only=True):
    evidence: HostBoundEvidence


class CollectiveBound(Finding, tag="collective_bound", kw_only=True):
    evidence: CollectiveEvidence


class StragglerRank(Finding, tag="straggler_rank", kw_only=True):
    evidence: StragglerEvidence


class WeightCopy(Finding, tag="weight_copy", kw_only=True):
    evidence: WeightCopyEvidence


class ProfilerOverhead(Finding, tag="profiler_overhead", kw_only=True):
    evidence: ProfilerEvidence


class OutsideStep(Finding, tag="outside_step", kw_only=True):
    evidence: ProfilerEvidence


AnyFinding = KvPoolCast | HostBound | CollectiveBound | StragglerRank | WeightCopy | ProfilerOverhead | OutsideStep


# Findings whose `share` is of the step's wall time (host-side causes); the others' is of its GPU time.
WALL_TIME_FINDINGS = ("host_bound", "profiler_overhead", "outside_step", "straggler_rank")
FINDING_TYPES: dict[str, type[Finding]] = {t.__struct_config__.tag: t for t in AnyFinding.__args__}


def make_finding(id: str, title: str, ms_per_step: float, share: float, evidence: dict, fix: str,
                 after: AfterFix | None = None) -> Finding:
    """The typed Finding of detector `id`, its numbers rounded as the report shows them; `evidence` the measured
    values by name (numpy numbers become plain ones). A name the evidence type lacks is refused: evidence is never
    dropped on the way to the report."""
    kind = FINDING_TYPES[id]
    evidence_type = _evidence_type(id)
    unknown = set(evidence) - set(evidence_type.__struct_fields__)
    if unknown:
        raise TypeError(f"{id}: evidence {sorted(unknown)} not in {evidence_type.__name__}")
    return kind(title=title, ms_per_step=round(float(ms_per_step), 4), share=round(float(share), 4),
                share_of="step_wall" if id in WALL_TIME_FINDINGS else "step_gpu_time", fix=fix, after_fix=after,
                evidence=msgspec.convert(_plain(evidence), evidence_type))


def _evidence_type(id: str) -> type[Loose]:
    hints = msgspec.structs.fields(FINDING_TYPES[id])
    return next(f.type for f in hints if f.name == "evidence")


def _plain(value):
    """numpy scalars and arrays as plain numbers and lists; non-finite numbers as None (JSON null)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
