"""The demo model's geometry: one tensor-parallel rank's slice of GLM-5 (MLA + MoE), at full or tiny scale.

Pure Python (no torch), so that `decodegap demo --help` and argument checks stay cheap."""

from __future__ import annotations

from dataclasses import dataclass, replace

KV_READS = ("full_cast", "gather_cast", "fused")
KV_DTYPES = ("fp8", "bf16")
SCALES = ("tiny", "full")
# fused is the Triton kernel; the other two are mla_decode's torch paths named after the incident and its patch
MLA_IMPL = {"full_cast": "full_cast", "gather_cast": "gather_cast", "fused": "triton"}


@dataclass(frozen=True)
class DemoConfig:
    layers: int
    dense_layers: int  # the first layers have a dense MLP instead of experts (GLM-5: 3)
    hidden: int
    heads: int  # local heads of this rank (GLM-5: 64 / TP8)
    q_lora: int
    kv_lora: int  # latent width; MLA's kernels fix it at 512 (+64 rope = 576)
    rope: int
    qk_nope: int
    v_head: int
    experts: int  # local routed experts
    top_k: int
    moe_intermediate: int  # per expert, this rank's slice
    dense_intermediate: int  # the dense layers' MLP, this rank's slice
    vocab: int  # this rank's slice of the vocabulary
    pool_slots: int  # token slots of the preallocated KV pool, per layer
    context: int  # active tokens per sequence (at random slots of the pool)
    batch: int = 1
    kv_dtype: str = "fp8"
    kv_read: str = "full_cast"
    cuda_graph: bool = False
    seed: int = 0

    @property
    def kv_width(self) -> int:
        return self.kv_lora + self.rope

    @property
    def sm_scale(self) -> float:
        return (self.qk_nope + self.rope) ** -0.5  # GLM-5: 1/sqrt(192 + 64) = 1/16

    @property
    def pool_bytes_per_layer(self) -> int:
        return self.pool_slots * self.kv_width * (1 if self.kv_dtype == "fp8" else 2)

    def with_(self, **changes) -> DemoConfig:
        return replace(self, **changes)

    def check(self) -> None:
        """ValueError with one line for a geometry the model cannot run."""
        if self.kv_read not in KV_READS:
            raise ValueError(f"kv_read must be one of {', '.join(KV_READS)}; got {self.kv_read!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}; got {self.kv_dtype!r}")
        if self.kv_lora != 512 or self.rope != 64:
            raise ValueError("the MLA decode kernels need a 512 + 64 latent")
        for name in ("layers", "hidden", "heads", "experts", "top_k", "vocab", "pool_slots", "context", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= experts ({self.experts})")
        if self.batch * self.context > self.pool_slots:
            raise ValueError(f"batch x context ({self.batch * self.context:,}) must fit in the pool "
                             f"({self.pool_slots:,} slots)")


# GLM-5 (glm_moe_dsa) sliced for one of 8 TP ranks, as in the reference trace: 64 heads / 8 = 16,
# vocab 154880 / 8 ~ 19392 (rounded up to a multiple of 64); q_lora as in the reference trace (1536).
FULL = DemoConfig(layers=78, dense_layers=3, hidden=6144, heads=16, q_lora=1536, kv_lora=512, rope=64, qk_nope=192,
                  v_head=256, experts=32, top_k=8, moe_intermediate=256, dense_intermediate=12288 // 8,
                  vocab=19392, pool_slots=495_552, context=2048)
# Small enough for a CPU in seconds, with a pool large enough (>= 16k slots, > 32 MB cast per layer) that the
# pool-wide cast dominates the step as it did in the incident.
TINY = DemoConfig(layers=4, dense_layers=1, hidden=256, heads=4, q_lora=128, kv_lora=512, rope=64, qk_nope=64,
                  v_head=64, experts=8, top_k=2, moe_intermediate=64, dense_intermediate=256, vocab=1024,
                  pool_slots=24_576, context=256)
PRESETS = {"full": FULL, "tiny": TINY}


def make_config(scale: str = "tiny", **overrides) -> DemoConfig:
    """A preset with the given fields replaced (None values are ignored), checked."""
    if scale not in PRESETS:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}; got {scale!r}")
    config = replace(PRESETS[scale], **{k: v for k, v in overrides.items() if v is not None})
    config.check()
    return config
