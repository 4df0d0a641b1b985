"""GPU table look-ups."""

import pytest

from decodegap.errors import UserError
from decodegap.floor import GPUS, get_gpu, resolve_gpu

REQUIRED = ("h100", "h200", "b200", "a100", "l40s", "rtx-pro-6000", "mi300x")


def test_required_gpus_with_bandwidth_tflops_interconnect():
    for gpu_id in REQUIRED:
        gpu = GPUS[gpu_id]
        assert gpu.bandwidth_gbps > 0 and gpu.tflops["bf16"] > 0 and gpu.interconnect_gbps > 0
        assert gpu.interconnect in ("nvlink", "pcie", "xgmi") and gpu.sm_count > 0
    assert GPUS["h100"].bandwidth_gbps == 3350 and GPUS["rtx-pro-6000"].bandwidth_gbps == 1792
    assert GPUS["rtx-pro-6000"].interconnect == "pcie" and GPUS["h200"].interconnect == "nvlink"


@pytest.mark.parametrize(
    "spelling,gpu_id",
    [
        ("H100", "h100"),
        ("H100-SXM", "h100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("h200", "h200"),
        ("B200", "b200"),
        ("A100-SXM4-80GB", "a100"),
        ("a100 40gb", "a100-40gb"),
        ("L40S", "l40s"),
        ("RTX PRO 6000 Blackwell", "rtx-pro-6000"),
        ("rtx6000pro", "rtx-pro-6000"),
        ("rtx-pro-6000", "rtx-pro-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("MI300X", "mi300x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("RTX 4090", "rtx-4090"),
    ],
)
def test_common_spellings(spelling, gpu_id):
    assert get_gpu(spelling).id == gpu_id


def test_unknown_gpu_lists_known_ids():
    with pytest.raises(UserError) as err:
        get_gpu("H300")
    assert all(gpu_id in str(err.value) for gpu_id in REQUIRED)


def test_fastest_dtype_the_gpu_has():
    assert GPUS["b200"].tflops_for(("fp4", "fp8", "bf16")) == ("fp4", 9000)
    assert GPUS["h100"].tflops_for(("fp4", "fp8", "bf16")) == ("fp8", 1979)
    assert GPUS["a100"].tflops_for(("fp8", "bf16")) == ("bf16", 312)


def test_custom_gpu():
    gpu = resolve_gpu("my-gpu", bandwidth_gbps=1000, tflops=100)
    assert (gpu.id, gpu.bandwidth_gbps, gpu.tflops_for(("fp8",))) == ("my-gpu", 1000, ("bf16", 100))
    with pytest.raises(UserError, match="both"):
        resolve_gpu(None, bandwidth_gbps=1000)
    with pytest.raises(UserError, match="give gpu= ") as exc:
        resolve_gpu(None)
    assert "give --gpu (one of" in exc.value.as_flags()  # as the floor command words it
