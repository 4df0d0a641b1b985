"""The least time a decode step can take, and the measured step set against it: model geometry from config.json
(`config`), quantization (`quant`), the GPU table (`hardware`), the floor per component (`floor`: `Floor`), and the
gap ledger that maps measured kernels onto the floor's components (`ledger`: `GapLedger`). Pure Python, no torch.

May import: the helpers (errors, records); the ledger reads a breakdown and findings handed to it, importing
neither."""

from decodegap.floor.config import ModelGeometry, geometry_from_dict, load_model, read_config_json
from decodegap.floor.floor import (
    FloorComponent,
    Floor,
    ReplicatedWeights,
    compute_floor,
    expected_distinct_experts,
)
from decodegap.floor.hardware import GPUS, GpuSpec, custom_gpu, get_gpu, resolve_gpu
from decodegap.floor.quant import (
    WEIGHT_FORMATS,
    QuantScheme,
    WeightFormat,
    load_quant,
    resolve_quant,
    weight_format,
    with_overrides,
)

__all__ = [
    "GPUS",
    "WEIGHT_FORMATS",
    "FloorComponent",
    "Floor",
    "GpuSpec",
    "ModelGeometry",
    "QuantScheme",
    "ReplicatedWeights",
    "WeightFormat",
    "compute_floor",
    "custom_gpu",
    "expected_distinct_experts",
    "geometry_from_dict",
    "get_gpu",
    "load_model",
    "load_quant",
    "read_config_json",
    "resolve_gpu",
    "resolve_quant",
    "weight_format",
    "with_overrides",
]
