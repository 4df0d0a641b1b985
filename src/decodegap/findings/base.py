"""The Finding record every detector returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    id: str  # stable snake_case word: kv_pool_cast, host_bound, ...
    title: str  # one sentence a user can act on
    ms_per_step: float  # time per decode step this cause costs
    share: float  # of the decode step's wall time
    evidence: dict = field(default_factory=dict)  # numbers that back the title
    fix: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "ms_per_step": self.ms_per_step, "share": self.share,
                "evidence": self.evidence, "fix": self.fix}
