"""Model geometry, quantization, GPU table and the decode-step floor: pure Python, no torch."""

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
