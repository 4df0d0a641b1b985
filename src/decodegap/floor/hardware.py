"""GPU table: memory bandwidth, dense tensor-core TFLOPS per dtype, interconnect. Datasheet peaks.

Sources (vendor datasheets; dense figures = the "with sparsity" figures halved):
  H100 SXM, H200 SXM    https://www.nvidia.com/en-us/data-center/h100/ , .../data-center/h200/
  B200 (DGX B200/HGX)   https://www.nvidia.com/en-us/data-center/dgx-b200/
                        (per GPU: 8 TB/s; 2.25 / 4.5 / 9 PF dense BF16 / FP8 / FP4)
  A100 SXM 80GB / 40GB  https://www.nvidia.com/en-us/data-center/a100/ (2,039 / 1,555 GB/s; 312 TF BF16)
  L40S                  https://www.nvidia.com/en-us/data-center/l40s/ (864 GB/s; 362 TF BF16, 733 FP8)
  RTX PRO 6000 Blackwell https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/
                        (1,792 GB/s GDDR7, 188 SMs; ~4 PF FP4 sparse -> ~1.87 PF dense FP4)
  RTX 4090              https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
                        (1,008 GB/s; 165 TF BF16 with FP32 accumulate, 330 FP8, 661 INT8)
  MI300X                https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html
                        (5.3 TB/s; 1,307 TF BF16, 2,615 FP8; 7 Infinity Fabric links x 64 GB/s per direction)
Interconnect GB/s is per direction, per GPU: NVLink4 450, NVLink5 900, NVLink3 300,
PCIe Gen5 x16 64, Gen4 x16 32.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from decodegap.errors import NAME_ONLY, ParameterError, UserError

# Small-message all-reduce latency per call (8 GPUs), the default the floor charges per collective.
# PCIe: NCCL on 8x RTX PRO 6000, 1K-16K fp16 elements, ~25-30 us (measured by others; the low end).
# NVLink: NCCL on 8x H200, ~16-20 us (measured by others; the low end). xGMI: no measurement at hand,
# taken as NVLink's. Engines' custom one-shot all-reduces can do better: override with allreduce_us.
DEFAULT_ALLREDUCE_US = {"pcie": 25.0, "nvlink": 16.0, "xgmi": 16.0}


@dataclass(frozen=True)
class GpuSpec:
    id: str
    name: str
    memory_gb: float
    bandwidth_gbps: float  # HBM/GDDR, GB/s (1e9 bytes)
    tflops: Mapping[str, float] = field(default_factory=dict)  # dense tensor-core peak per dtype
    interconnect: str = "pcie"  # "nvlink" | "pcie" | "xgmi"
    interconnect_gbps: float = 64.0  # per direction, per GPU
    sm_count: int = 0

    def tflops_for(self, dtypes: tuple[str, ...]) -> tuple[str, float]:
        """The fastest of `dtypes` (in preference order) this GPU runs; falls back to its BF16/FP16 rate."""
        for dtype in dtypes:
            if self.tflops.get(dtype):
                return dtype, self.tflops[dtype]
        for dtype in ("bf16", "fp16"):
            if self.tflops.get(dtype):
                return dtype, self.tflops[dtype]
        raise UserError(f"GPU '{self.id}' has no TFLOPS figure")

    @property
    def default_allreduce_us(self) -> float:
        return DEFAULT_ALLREDUCE_US.get(self.interconnect, DEFAULT_ALLREDUCE_US["pcie"])


def _gpu(
    id: str,
    name: str,
    memory_gb: float,
    bandwidth_gbps: float,
    tflops: dict[str, float],
    interconnect: str,
    interconnect_gbps: float,
    sm_count: int,
) -> GpuSpec:
    return GpuSpec(
        id,
        name,
        memory_gb,
        bandwidth_gbps,
        MappingProxyType(tflops),
        interconnect,
        interconnect_gbps,
        sm_count,
    )


GPUS: dict[str, GpuSpec] = {
    g.id: g
    for g in (
        _gpu(
            "h100",
            "NVIDIA H100 SXM 80GB",
            80,
            3350,
            {"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            "nvlink",
            450,
            132,
        ),
        _gpu(
            "h200",
            "NVIDIA H200 SXM 141GB",
            141,
            4800,
            {"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979},
            "nvlink",
            450,
            132,
        ),
        _gpu(
            "b200",
            "NVIDIA B200 180GB",
            180,
            8000,
            {"bf16": 2250, "fp16": 2250, "fp8": 4500, "int8": 4500, "fp4": 9000},
            "nvlink",
            900,
            148,
        ),
        _gpu(
            "a100",
            "NVIDIA A100 SXM 80GB",
            80,
            2039,
            {"bf16": 312, "fp16": 312, "int8": 624},
            "nvlink",
            300,
            108,
        ),
        _gpu(
            "a100-40gb",
            "NVIDIA A100 SXM 40GB",
            40,
            1555,
            {"bf16": 312, "fp16": 312, "int8": 624},
            "nvlink",
            300,
            108,
        ),
        _gpu(
            "l40s",
            "NVIDIA L40S",
            48,
            864,
            {"bf16": 362, "fp16": 362, "fp8": 733, "int8": 733},
            "pcie",
            32,
            142,
        ),
        _gpu(
            "rtx-pro-6000",
            "NVIDIA RTX PRO 6000 Blackwell",
            96,
            1792,
            {"bf16": 468, "fp16": 468, "fp8": 936, "int8": 936, "fp4": 1871},
            "pcie",
            64,
            188,
        ),
        _gpu(
            "rtx-4090",
            "NVIDIA GeForce RTX 4090",
            24,
            1008,
            {"bf16": 165, "fp16": 165, "fp8": 330, "int8": 661},
            "pcie",
            32,
            128,
        ),
        _gpu(
            "mi300x",
            "AMD Instinct MI300X",
            192,
            5300,
            {"bf16": 1307, "fp16": 1307, "fp8": 2615, "int8": 2615},
            "xgmi",
            448,
            304,
        ),
    )
}

# Spellings people use, after lower-casing and dropping everything but letters and digits.
_ALIASES = {
    "h100sxm": "h100",
    "h100sxm5": "h100",
    "h10080gb": "h100",
    "h100sxm80gb": "h100",
    "h100hbm3": "h100",
    "h200sxm": "h200",
    "h200141gb": "h200",
    "h200nvl": "h200",
    "b200sxm": "b200",
    "hgxb200": "b200",
    "dgxb200": "b200",
    "a10080gb": "a100",
    "a100sxm": "a100",
    "a100sxm80gb": "a100",
    "a100sxm4": "a100",
    "a100sxm480gb": "a100",
    "a10040gb": "a100-40gb",
    "a100sxm40gb": "a100-40gb",
    "a100sxm440gb": "a100-40gb",
    "l40s48gb": "l40s",
    "rtxpro6000": "rtx-pro-6000",
    "rtx6000pro": "rtx-pro-6000",
    "pro6000": "rtx-pro-6000",
    "rtxpro6000blackwell": "rtx-pro-6000",
    "rtxpro6000blackwellserver": "rtx-pro-6000",
    "rtxpro6000blackwellserveredition": "rtx-pro-6000",
    "rtxpro6000blackwellworkstation": "rtx-pro-6000",
    "rtxpro6000blackwellworkstationedition": "rtx-pro-6000",
    "rtxpro6000server": "rtx-pro-6000",
    "rtxpro6000se": "rtx-pro-6000",
    "rtxpro6000ws": "rtx-pro-6000",
    "rtx6000problackwell": "rtx-pro-6000",
    "4090": "rtx-4090",
    "rtx4090": "rtx-4090",
    "geforcertx4090": "rtx-4090",
    "mi300": "mi300x",
    "instinctmi300x": "mi300x",
}
_NOISE = ("nvidia", "amd", "geforce", "tesla")


def _normalise(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for word in _NOISE:
        if key.startswith(word) and len(key) > len(word):
            key = key[len(word) :]
    return key


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU by id or common spelling ("H100-SXM", "RTX PRO 6000 Blackwell", "rtx6000pro")."""
    if name in GPUS:
        return GPUS[name]
    key = _normalise(name)
    by_plain_id = {_normalise(gpu_id): gpu_id for gpu_id in GPUS}
    gpu_id = by_plain_id.get(key) or _ALIASES.get(key)
    if gpu_id is None:  # torch device names: "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
        bare = _normalise(re.sub(r"\b(\d+gb|hbm3e?|sxm\d?)\b", " ", name.lower().replace("_", " ")))
        gpu_id = by_plain_id.get(bare) or _ALIASES.get(bare)
    if gpu_id is None:
        raise ParameterError(f"{{gpu}}: unknown GPU; known: {', '.join(GPUS)}", gpu=name)
    return GPUS[gpu_id]


CUSTOM_GPU_RANGE = (0.001, 1e9)  # GB/s and TFLOPS a GPU not in the table may be given


def custom_gpu(
    bandwidth_gbps: float,
    tflops: float,
    name: str = "custom",
    interconnect: str = "pcie",
    interconnect_gbps: float | None = None,
) -> GpuSpec:
    """A GPU not in the table: its memory bandwidth (GB/s) and dense BF16 TFLOPS (used for every dtype)."""
    # bounded, not only finite: a bandwidth of 5e-324 GB/s (a denormal) made the floor's times Infinity (no JSON)
    for param, value, unit in (("bandwidth_gbps", bandwidth_gbps, "GB/s"), ("tflops", tflops, "TFLOPS")):
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                           and CUSTOM_GPU_RANGE[0] <= value <= CUSTOM_GPU_RANGE[1]):
            raise ParameterError(f"{{{param}}}: not a number of {unit} (a finite number from "
                                 f"{CUSTOM_GPU_RANGE[0]:g} to {CUSTOM_GPU_RANGE[1]:.0e})", **{param: value})
    if interconnect not in DEFAULT_ALLREDUCE_US:
        raise UserError(f"unknown interconnect '{interconnect}'; known: {', '.join(DEFAULT_ALLREDUCE_US)}")
    link = (
        interconnect_gbps
        if interconnect_gbps is not None
        else {"pcie": 64.0, "nvlink": 450.0, "xgmi": 448.0}[interconnect]
    )
    return GpuSpec(
        name, name, 0.0, float(bandwidth_gbps), MappingProxyType({"bf16": float(tflops)}), interconnect, link
    )


def resolve_gpu(
    name: str | None, bandwidth_gbps: float | None = None, tflops: float | None = None
) -> GpuSpec:
    """--gpu NAME, or --bandwidth/--tflops for a GPU not in the table (NAME then only labels it)."""
    if bandwidth_gbps is not None or tflops is not None:
        if bandwidth_gbps is None or tflops is None:
            raise ParameterError("a GPU not in the table needs both {bandwidth_gbps} and {tflops}",
                                 bandwidth_gbps=NAME_ONLY, tflops=NAME_ONLY)
        return custom_gpu(bandwidth_gbps, tflops, name=name or "custom")
    if not name:
        raise ParameterError(f"no GPU: give {{gpu}} (one of: {', '.join(GPUS)}), or {{bandwidth_gbps}} and "
                             "{tflops} for a GPU not in the table", gpu=NAME_ONLY, bandwidth_gbps=NAME_ONLY,
                             tflops=NAME_ONLY)
    try:
        return get_gpu(name)
    except ParameterError as exc:
        raise ParameterError(exc.template + ", or {bandwidth_gbps} and {tflops} for a GPU not in the table",
                             **exc.values, bandwidth_gbps=NAME_ONLY, tflops=NAME_ONLY) from None
