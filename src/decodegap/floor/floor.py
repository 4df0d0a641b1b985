"""The floor: the least time one decode step can take on given hardware, per component, and why.

Every component is charged max(bytes / bandwidth, flops / peak TFLOPS); components add up; TP collectives add
latency + bytes / link bandwidth. Everything favours the hardware, so the result is a lower bound.
"""

from __future__ import annotations

import math
import numbers

import msgspec

from decodegap.errors import NAME_ONLY, ParameterError
from decodegap.floor.geometry import ModelGeometry
from decodegap.floor.hardware import GpuSpec
from decodegap.floor.layout import DENSE, MOE, Layer
from decodegap.floor.quant import QuantScheme, WeightFormat
from decodegap.records import Struct, as_json_data

ACTIVATION_BYTES = 2  # bf16 hidden states crossing the all-reduce
# Floor times are rounded once, here, to this many decimals of a millisecond: the floor's own report, its JSON and
# the gap ledger then show one value (rounding again at another precision would move a figure like 2.9145).
MS_DIGITS = 6
ENGINE_MEMORY_SHARE = 0.9  # of GPU memory an engine allots weights and KV by default (vLLM gpu_memory_utilization)
INDEXER_SCALE_BYTES = 4  # one fp32 scale per FP8 indexer key (DeepSeek-V3.2 cache layout)


class FloorComponent(Struct):
    """One part of the step's least time: max(bytes / bandwidth, flops / peak) of what it reads and computes."""

    name: str
    category: str  # the measured-breakdown category this time shows up under (gemm, moe, attention, collective)
    bytes_per_gpu: int
    flops_per_gpu: int
    memory_ms: float
    compute_ms: float
    ms: float
    bound: str  # "memory" | "compute" | "latency" | "interconnect"
    formats: str  # weight format(s) or KV dtype
    detail: str


def make_component(name: str, category: str, nbytes: float, flops: float, memory_ms: float, compute_ms: float,
                   ms: float, bound: str, formats: str = "", detail: str = "") -> FloorComponent:
    """A component: bytes and flops whole, its time (`ms`, what the floor adds up) rounded to MS_DIGITS once, so
    that the floor, its report and the gap ledger show one value; memory and compute time as computed (the report
    rounds them, Floor.rounded)."""
    return FloorComponent(name=name, category=category, bytes_per_gpu=round(nbytes), flops_per_gpu=round(flops),
                          memory_ms=memory_ms, compute_ms=compute_ms, ms=round(ms, MS_DIGITS), bound=bound,
                          formats=formats, detail=detail)


class Params(Struct):
    """Parameter counts: `active` is what one token reads (output head counted, input embedding table not: OpenAI,
    DeepSeek, Moonshot); the other publishers' conventions under their own names (docs/floor.md)."""

    total: int
    active: int
    active_with_embeddings: int
    active_non_embedding: int
    mtp: int


class MemoryPerGpu(Struct):
    weights_bytes: int  # every weight a rank holds (all experts), not what a step reads
    kv_bytes: int  # the KV cache of batch x context tokens on one rank
    gpu_bytes: int | None  # None when unknown (a custom GPU)
    fits: bool | None


class ReplicatedWeights(Struct):
    """Weights engines keep whole on every TP rank; the floor assumes them split: extra, shown apart."""

    modules: tuple[str, ...]
    extra_bytes_per_gpu: int
    extra_ms: float


FLOOR_SCHEMA = "decodegap.floor/1"


class Floor(Struct):
    """The least time of one decode step on given hardware, per component, and what it assumes."""

    schema: str  # FLOOR_SCHEMA
    model_type: str
    gpu: str
    tp: int
    batch: int
    context: int
    quant: str
    floor_ms: float
    tokens_per_s: float  # per sequence
    aggregate_tokens_per_s: float
    bound: str
    allreduce_us: float
    params: Params
    memory_per_gpu: MemoryPerGpu
    warnings: tuple[str, ...]
    components: tuple[FloorComponent, ...]
    replicated_weights: ReplicatedWeights
    assumptions: tuple[str, ...]

    @property
    def weight_bytes_per_gpu(self) -> int:
        return sum(c.bytes_per_gpu for c in self.components if c.category in ("gemm", "moe"))

    def component(self, name: str) -> FloorComponent:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    def rounded(self) -> Floor:
        """The floor as reports show it: times to MS_DIGITS decimals of a millisecond, rates to 3."""
        ms = MS_DIGITS
        return msgspec.structs.replace(
            self, floor_ms=round(self.floor_ms, ms), tokens_per_s=round(self.tokens_per_s, 3),
            aggregate_tokens_per_s=round(self.aggregate_tokens_per_s, 3),
            components=tuple(msgspec.structs.replace(c, memory_ms=round(c.memory_ms, ms),
                                                     compute_ms=round(c.compute_ms, ms), ms=round(c.ms, ms))
                             for c in self.components),
            replicated_weights=msgspec.structs.replace(self.replicated_weights,
                                                       extra_ms=round(self.replicated_weights.extra_ms, ms)))

    def to_dict(self) -> dict:
        """The floor as `decodegap floor --format json` prints it (schema decodegap.floor/1)."""
        return as_json_data(self.rounded())


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts B tokens touch when each picks top_k of E uniformly: E * (1 - (1 - k/E)^B)."""
    if num_experts <= 0 or top_k <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


class _Accumulator:
    """Bytes, flops and compute time of one component, summed over layers that may differ in format."""

    def __init__(self, gpu: GpuSpec):
        self.gpu = gpu
        self.bytes = 0.0
        self.flops = 0.0
        self.compute_ms = 0.0
        self.formats: dict[str, None] = {}

    def add(self, nbytes: float, flops: float, compute_dtypes: tuple[str, ...], label: str) -> None:
        _, tflops = self.gpu.tflops_for(compute_dtypes)
        self.bytes += nbytes
        self.flops += flops
        self.compute_ms += flops / (tflops * 1e12) * 1e3
        self.formats[label] = None

    def add_weights(self, params: float, fmt: WeightFormat, tp: int, tokens: float) -> None:
        """`params` weights split over tp ranks, each multiplied by `tokens` token vectors."""
        self.add(params * fmt.bytes_per_weight / tp, 2.0 * params * tokens / tp, fmt.compute, fmt.name)

    def component(self, name: str, category: str, detail: str = "") -> FloorComponent:
        memory_ms = self.bytes / (self.gpu.bandwidth_gbps * 1e9) * 1e3
        bound = "compute" if self.compute_ms > memory_ms else "memory"
        return make_component(name, category, self.bytes, self.flops, memory_ms, self.compute_ms,
                         max(memory_ms, self.compute_ms), bound, "+".join(self.formats), detail)


def _attention_tokens(geometry: ModelGeometry, layer: Layer, context: int, sparse_attention: bool) -> int:
    """KV tokens one attention layer reads for one sequence."""
    if geometry.has_indexer and sparse_attention and geometry.indexer_topk:
        return min(context, geometry.indexer_topk)
    if layer.window:  # sliding (or chunked) attention reads at most its window
        return min(context, layer.window)
    return context


def compute_floor(
    geometry: ModelGeometry,
    quant: QuantScheme,
    gpu: GpuSpec,
    tp: int = 1,
    batch: int = 1,
    context: int = 4096,
    allreduce_us: float | None = None,
    sparse_attention: bool = True,
) -> Floor:
    """Least time of one decode step of `batch` sequences, each with `context` tokens of KV, on `tp` GPUs.

    allreduce_us overrides the per-call all-reduce latency (default: by interconnect, see hardware.py).
    sparse_attention=False runs a DSA model's attention densely over the whole context, as engines without a
    sparse-MLA kernel do (and skips the indexer).
    """
    check_counts(tp=tp, batch=batch, context=context)
    if allreduce_us is not None and (isinstance(allreduce_us, bool) or not isinstance(allreduce_us, numbers.Real)
                                     or not (math.isfinite(allreduce_us) and 0 <= allreduce_us <= MOST_ALLREDUCE_US)):
        raise ParameterError("{allreduce_us}: not an all-reduce latency (a finite number of us, at least 0, at most "
                             f"{MOST_ALLREDUCE_US:.0e})", allreduce_us=allreduce_us)
    check_tp(geometry, tp)
    g = geometry
    use_indexer = g.has_indexer and sparse_attention
    comps: list[FloorComponent] = []

    # -- weights, ideally split over the TP ranks ------------------------------------------------------
    attn = _Accumulator(gpu)
    indexer = _Accumulator(gpu)
    attn_params = g.attention_params_per_layer
    attention_layers = [i for i, layer in enumerate(g.layers) if layer.attention]
    for i in attention_layers:
        attn.add_weights(attn_params, quant.format_for(g, "attention", i), tp, batch)
        if use_indexer:
            indexer.add_weights(g.indexer_params_per_layer, quant.format_for(g, "indexer", i), tp, batch)
    if attention_layers:
        comps.append(attn.component("attention_weights", "gemm",
                                    f"{len(attention_layers)} layers x {attn_params / 1e6:.1f}M"))
    if use_indexer:
        comps.append(
            indexer.component(
                "indexer_weights", "gemm",
                f"{len(attention_layers)} layers x {g.indexer_params_per_layer / 1e6:.2f}M"
            )
        )
    if g.recurrent:  # Mamba / DeltaNet / conv mixers: their projections, read like any weight
        rec = _Accumulator(gpu)
        for i, layer in enumerate(g.layers):
            if layer.recurrent:
                rec.add_weights(g.recurrent.params, quant.format_for(g, "recurrent", i), tp, batch)
        comps.append(rec.component("recurrent_weights", "gemm", f"{g.num_recurrent_layers} {g.recurrent.kind} "
                                   f"layers x {g.recurrent.params / 1e6:.1f}M"))

    if g.num_dense_layers:
        dense = _Accumulator(gpu)
        for i, layer in enumerate(g.layers):
            if layer.mlp == DENSE:
                dense.add_weights(g.mlp_params(layer.mlp_width), quant.format_for(g, "dense_mlp", i), tp, batch)
        comps.append(
            dense.component(
                "dense_mlp", "gemm", f"{g.num_dense_layers} layers x {g.dense_mlp_params / 1e6:.1f}M"
            )
        )

    if g.is_moe:
        touched = expected_distinct_experts(g.num_experts, g.experts_per_token, batch)
        experts, shared, router = _Accumulator(gpu), _Accumulator(gpu), _Accumulator(gpu)
        for layer in (i for i, x in enumerate(g.layers) if x.mlp == MOE):
            fmt = quant.format_for(g, "experts", layer)
            # Bytes for the experts touched; flops for the k experts each token actually runs.
            experts.add(
                touched * g.expert_params * fmt.bytes_per_weight / tp,
                2.0 * batch * g.experts_per_token * g.expert_params / tp,
                fmt.compute,
                fmt.name,
            )
            if g.shared_expert_params:
                shared.add_weights(
                    g.shared_expert_params, quant.format_for(g, "shared_experts", layer), tp, batch
                )
            router.add_weights(g.router_params, quant.format_for(g, "router", layer), tp, batch)
        comps.append(
            experts.component(
                "experts",
                "moe",
                f"{g.num_moe_layers} layers x {touched:.1f} of {g.num_experts} experts"
                f" x {g.expert_params / 1e6:.1f}M",
            )
        )
        if g.shared_expert_params:
            comps.append(
                shared.component(
                    "shared_experts",
                    "gemm",
                    f"{g.num_moe_layers} layers x {g.shared_expert_params / 1e6:.1f}M",
                )
            )
        comps.append(
            router.component("router", "moe", f"{g.num_moe_layers} layers x {g.router_params / 1e6:.2f}M")
        )

    head = _Accumulator(gpu)
    head.add_weights(g.vocab * g.hidden, quant.format_for(g, "lm_head"), tp, batch)
    comps.append(
        head.component("lm_head", "gemm", f"{g.vocab} x {g.hidden}" + (" (tied)" if g.tie_embeddings else ""))
    )

    # -- KV cache: B sequences x their context, at the KV dtype ------------------------------------------
    kv_elem = quant.kv_bytes_per_element
    kv_dtypes = ("fp8", "bf16") if kv_elem == 1 else ("bf16",)
    # MLA keeps one latent per token that every head reads, so each TP rank reads all of it; GQA splits the
    # KV heads over min(tp, kv_heads) ranks (beyond that, ranks hold copies).
    kv_shards = 1 if g.is_mla else min(tp, g.num_kv_heads)
    kv = _Accumulator(gpu)
    tokens_read = 0
    for layer in g.layers:
        if not layer.attention:
            continue
        tokens = _attention_tokens(g, layer, context, sparse_attention)
        tokens_read += tokens
        if g.is_mla:  # absorbed MLA: scores over the 576-wide latent, output over the 512-wide latent
            flops = 2.0 * tokens * g.num_heads * (g.kv_width + g.kv_lora_rank) / tp
        else:
            flops = 2.0 * tokens * g.num_heads * (g.head_dim + g.value_head_dim) / tp
        kv.add(batch * tokens * g.kv_width * kv_elem / kv_shards, batch * flops, kv_dtypes, quant.kv_dtype)
    if attention_layers:
        comps.append(
            kv.component(
                "kv_cache",
                "attention",
                f"{batch} x {tokens_read / len(attention_layers):.0f} tokens/layer x "
                f"{g.kv_width} x {kv_elem:g} B" + (" (latent, on every rank)" if g.is_mla else ""),
            )
        )
    if g.recurrent:
        # A recurrent layer reads its state and convolution window and writes them back, every step, whatever
        # the context: that replaces the KV cache's growing read. Split over the mixer's heads where it has them,
        # else over its channels (Mamba-1's inner width, a short convolution's hidden channels), as its weights are.
        r = g.recurrent
        shards = min(tp, r.heads) if r.heads else tp
        per_layer = r.state_bytes_per_sequence
        state = _Accumulator(gpu)
        for _ in range(g.num_recurrent_layers):
            # read + write; ~4 flops per state element (decay, outer-product update, readout)
            state.add(2.0 * batch * per_layer / shards, 4.0 * batch * (r.state_elements + r.conv_elements) / shards,
                      ("bf16",), f"state {r.state_bytes * 8}-bit")
        comps.append(state.component(
            "recurrent_state", "attention",
            f"{batch} x {g.num_recurrent_layers} layers x {per_layer / 1e3:.1f} kB read + written"))
    if use_indexer:
        key_bytes = g.indexer_head_dim * kv_elem + (INDEXER_SCALE_BYTES if kv_elem == 1 else 0)
        idx = _Accumulator(gpu)
        for _ in range(g.num_layers):
            idx.add(
                batch * context * key_bytes,
                2.0 * batch * context * g.indexer_heads * g.indexer_head_dim,
                kv_dtypes,
                quant.kv_dtype,
            )
        comps.append(
            idx.component(
                "indexer_cache",
                "attention",
                f"{batch} x {context} keys x {key_bytes:g} B, top-{g.indexer_topk}",
            )
        )

    # -- collectives -----------------------------------------------------------------------------------
    latency_us = gpu.default_allreduce_us if allreduce_us is None else float(allreduce_us)
    if tp > 1:
        # after the mixer(s) and after the MLP/MoE of every layer (Nemotron-H's layers have one of the two)
        calls = sum(bool(x.attention or x.recurrent) + bool(x.mlp) for x in g.layers)
        message = batch * g.hidden * ACTIVATION_BYTES
        wire_bytes = 2.0 * (tp - 1) / tp * message  # ring all-reduce: each rank sends and receives this much
        wire_us = wire_bytes / (gpu.interconnect_gbps * 1e9) * 1e6
        ms = calls * (latency_us + wire_us) / 1e3
        comps.append(
            make_component(
                "allreduce",
                "collective",
                calls * wire_bytes,
                0.0,
                0.0,
                0.0,
                ms,
                "latency" if latency_us >= wire_us else "interconnect",
                gpu.interconnect,
                f"{calls} calls x ({latency_us:g} us + {wire_us:.2f} us for {message} B)",
            )
        )

    floor_ms = round(sum(c.ms for c in comps), MS_DIGITS)
    by_bound: dict[str, float] = {}
    for c in comps:
        key = "collective" if c.category == "collective" else c.bound
        by_bound[key] = by_bound.get(key, 0.0) + c.ms
    bound = max(by_bound, key=lambda k: by_bound[k]) if floor_ms > 0 else "memory"

    modules, extra_bytes, extra_ms = _replicated_weights(g, quant, gpu, tp, use_indexer)
    stored = stored_weight_bytes(g, quant) / tp + extra_bytes
    # What the KV cache (and recurrent state, held once: read and written in place) takes per GPU.
    kv_bytes = sum(c.bytes_per_gpu for c in comps if c.name == "kv_cache")
    kv_bytes += sum(c.bytes_per_gpu / 2 for c in comps if c.name == "recurrent_state")
    gpu_bytes = gpu.memory_gb * 2**30  # datasheet "GB" read as GiB: generous, so only a real overflow warns
    warnings = list(g.warnings)
    held = f"{stored / 2**30:,.1f} GiB of weights + {kv_bytes / 2**30:,.1f} GiB of KV per GPU"  # one unit throughout
    if gpu_bytes and stored + kv_bytes > gpu_bytes:
        warnings.append(f"does not fit: {held} exceed the {gpu.memory_gb:g} GiB of a {gpu.id} at tp {tp}; this "
                        "floor is for a setup that cannot run")
    elif gpu_bytes and stored + kv_bytes > ENGINE_MEMORY_SHARE * gpu_bytes:
        warnings.append(f"barely fits: {held} take {(stored + kv_bytes) / gpu_bytes:.0%} of the "
                        f"{gpu.memory_gb:g} GiB of a {gpu.id} at tp {tp}, more than the {ENGINE_MEMORY_SHARE:.0%} "
                        "engines give weights and KV by default (vLLM's gpu_memory_utilization): little is left for "
                        "activations and CUDA graphs")
    tokens_per_s = 1e3 / floor_ms if floor_ms > 0 else float("inf")
    return Floor(
        schema=FLOOR_SCHEMA,
        model_type=g.model_type,
        gpu=gpu.id,
        tp=tp,
        batch=batch,
        context=context,
        quant=quant.describe(),
        floor_ms=floor_ms,
        tokens_per_s=tokens_per_s,
        aggregate_tokens_per_s=tokens_per_s * batch,
        bound=bound,
        allreduce_us=float(latency_us),
        params=Params(total=g.params_total, active=g.params_active,
                      active_with_embeddings=g.params_active_with_embeddings,
                      active_non_embedding=g.params_active_non_embedding, mtp=g.params_mtp),
        memory_per_gpu=MemoryPerGpu(weights_bytes=round(stored), kv_bytes=round(kv_bytes),
                                    gpu_bytes=round(gpu_bytes) or None,
                                    fits=stored + kv_bytes <= gpu_bytes if gpu_bytes else None),
        warnings=tuple(warnings),
        components=tuple(comps),
        replicated_weights=ReplicatedWeights(modules=modules, extra_bytes_per_gpu=round(extra_bytes),
                                             extra_ms=extra_ms),
        assumptions=_assumptions(g, gpu, tp, batch, context, latency_us, use_indexer),
    )


# What each count means, for its error line; the least value it may take.
# (what, least, most): the most are analyze's flag ranges; beyond them the floor's arithmetic leaves floats (a
# context of 10**400 tokens is no float: OverflowError)
COUNTS = {"tp": ("tensor-parallel ranks", 1, 1024), "batch": ("sequences per step", 1, 1_000_000),
          "context": ("KV tokens per sequence", 0, 100_000_000)}


# An all-reduce of 1e308 us is finite, but times the calls of a step it is not: the floor read Infinity (no JSON)
MOST_ALLREDUCE_US = 1e9


def check_counts(**values) -> None:
    """tp, batch, context: whole numbers, at least 1 (context: 0) and at most COUNTS' bound; else one line naming
    the parameter."""
    for name, value in values.items():
        what, least, most = COUNTS[name]
        if value is None and name == "context":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            kind = "" if isinstance(value, numbers.Real) else f", not a {type(value).__name__}"
            raise ParameterError(f"{{{name}}}: the {what} must be a whole number of at least {least}{kind}",
                                 **{name: value})
        if value > most:
            shown = value if value < 10**30 else f"a number of {len(str(value))} digits"  # one readable line
            raise ParameterError(f"{{{name}}}: {shown} {what}; at most {most:,} are modelled", **{name: NAME_ONLY})


def _valid_tps(g: ModelGeometry) -> list[int]:
    most = max(g.num_heads, g.recurrent.heads if g.recurrent else 0, 1)
    return [t for t in range(1, most + 1) if _tp_problem(g, t) is None]


def _tp_problem(g: ModelGeometry, tp: int) -> str | None:
    """Why tp ranks cannot shard this model, or None."""
    if g.num_heads and g.num_heads % tp:
        return (f"cannot shard {g.num_heads} attention heads (num_attention_heads must be divisible by the "
                "tensor-parallel ranks)")
    kv = g.num_kv_heads
    if kv and not g.is_mla and kv % tp and tp % kv:
        return (f"cannot shard {kv} KV heads (num_key_value_heads must be divisible by the tensor-parallel ranks, "
                "or they by it)")
    r = g.recurrent
    if r and r.heads and r.heads % tp:
        return f"cannot shard the {r.heads} heads of its {r.kind} layers (they must be divisible by the ranks)"
    return None


def check_tp(g: ModelGeometry, tp: int) -> None:
    """The engines' rule (vLLM, SGLang): query heads split evenly over the ranks; KV heads too, or each KV head
    replicated on tp / kv_heads ranks; a recurrent mixer's heads evenly too. MLA's latent is shared by all heads,
    so only the query heads count."""
    problem = _tp_problem(g, tp)
    if problem:
        valid = ", ".join(str(t) for t in _valid_tps(g))
        raise ParameterError(f"{{tp}} {problem}: give one of {valid}", tp=tp)


def stored_weight_bytes(g: ModelGeometry, quant: QuantScheme) -> float:
    """Bytes of every weight of the main model as stored (all experts, embedding table, head), before sharding."""
    total = 0.0
    for i, layer in enumerate(g.layers):
        if layer.attention:
            total += g.attention_params_per_layer * quant.format_for(g, "attention", i).bytes_per_weight
            total += g.indexer_params_per_layer * quant.format_for(g, "indexer", i).bytes_per_weight
        if layer.recurrent:
            total += g.recurrent_params_per_layer * quant.format_for(g, "recurrent", i).bytes_per_weight
        if layer.mlp == DENSE:
            total += g.mlp_params(layer.mlp_width) * quant.format_for(g, "dense_mlp", i).bytes_per_weight
        elif layer.mlp == MOE:
            total += g.num_experts * g.expert_params * quant.format_for(g, "experts", i).bytes_per_weight
            total += g.shared_expert_params * quant.format_for(g, "shared_experts", i).bytes_per_weight
            total += g.router_params * quant.format_for(g, "router", i).bytes_per_weight
    total += g.norm_params_per_layer * g.num_layers * 2
    total += g.embedding_params * quant.format_for(g, "embedding").bytes_per_weight
    total += g.lm_head_params * quant.format_for(g, "lm_head").bytes_per_weight
    return total


def _replicated_weights(
    g: ModelGeometry, quant: QuantScheme, gpu: GpuSpec, tp: int, use_indexer: bool
) -> tuple[tuple[str, ...], float, float]:
    """What vLLM/SGLang keep whole on every rank: MLA's down-projections (q_a, kv_a), the DSA indexer, the MoE
    router, and K/V projections once tp exceeds the KV heads. (modules, extra bytes each rank reads beyond its
    1/tp, their ms)."""
    if tp <= 1:
        return (), 0.0, 0.0
    modules: list[str] = []
    extra = 0.0
    if g.is_mla:
        proj = g.attention_projection_params()
        names = [n for n in ("q_a_proj", "kv_a_proj_with_mqa") if n in proj]
        modules += [f"self_attn.{n}" for n in names]
        for layer in (i for i, x in enumerate(g.layers) if x.attention):
            fmt = quant.format_for(g, "attention", layer)
            extra += sum(proj[n] for n in names) * fmt.bytes_per_weight * (1 - 1 / tp)
    elif g.num_kv_heads and tp > g.num_kv_heads:
        proj = g.attention_projection_params()
        modules += ["self_attn.k_proj", "self_attn.v_proj"]
        for layer in (i for i, x in enumerate(g.layers) if x.attention):
            fmt = quant.format_for(g, "attention", layer)
            extra += (proj["k_proj"] + proj["v_proj"]) * fmt.bytes_per_weight * (1 / g.num_kv_heads - 1 / tp)
    if use_indexer:
        modules.append("self_attn.indexer")
        for layer in (i for i, x in enumerate(g.layers) if x.attention):
            fmt = quant.format_for(g, "indexer", layer)
            extra += g.indexer_params_per_layer * fmt.bytes_per_weight * (1 - 1 / tp)
    if g.is_moe:
        modules.append("mlp.gate (router)")
        extra += (
            g.num_moe_layers * g.router_params * quant.format_for(g, "router").bytes_per_weight * (1 - 1 / tp)
        )
    return tuple(modules), extra, extra / (gpu.bandwidth_gbps * 1e9) * 1e3


def _assumptions(
    g: ModelGeometry, gpu: GpuSpec, tp: int, batch: int, context: int, latency_us: float, use_indexer: bool
) -> tuple[str, ...]:
    out = [
        f"peak datasheet figures: {gpu.bandwidth_gbps:g} GB/s memory, dense tensor-core TFLOPS per dtype",
        (
            "each component costs max(bytes / bandwidth, flops / TFLOPS); components run back to back, "
            "each at peak, with no launch gaps"
        ),
        f"weights split ideally 1/{tp} per GPU; engines replicate some (replicated_weights, not in the floor)"
        if tp > 1
        else "one GPU holds all weights",
        "activations, norms, embedding lookup, rotary, sampling and the host are free",
    ]
    if g.is_moe:
        out.append(
            f"MoE: each of {batch} tokens picks {g.experts_per_token} of {g.num_experts} experts uniformly; "
            f"distinct experts read per layer = E(1-(1-k/E)^B)"
        )
    if g.is_mla:
        out.append("MLA: absorbed decode reads one latent per token per layer, the same on every TP rank")
    elif g.num_attention_layers:
        out.append(f"KV heads split over min(tp, kv_heads) = {min(tp, g.num_kv_heads)} ranks")
    if g.num_attention_layers:
        out.append(
            f"every sequence has {context} tokens of KV in each of {g.num_attention_layers} attention layers"
            + (f"; sliding layers read at most {g.sliding_window}" if g.sliding_window else "")
        )
    if g.recurrent:
        out.append(f"{g.num_recurrent_layers} {g.recurrent.kind} layers read and write a fixed state per sequence "
                   f"each step ({g.recurrent.state_bytes_per_sequence:,} B per layer), whatever the context")
    if use_indexer:
        out.append(f"DSA: attention reads the top {g.indexer_topk} tokens; the indexer reads every key")
    if tp > 1:
        out.append(
            f"an all-reduce after each mixer and MLP, each {latency_us:g} us + ring bytes / "
            f"{gpu.interconnect_gbps:g} GB/s; "
            "logit gather and vocab-parallel embedding all-reduce not counted"
        )
    return tuple(out)
