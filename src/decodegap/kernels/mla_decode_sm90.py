"""The CUDA fast path for FP8 caches with 1..16 heads on Hopper: stage 1 of the split-KV decode
(mla_decode_sm90.cu), merged by the Triton merge kernel.

Build: at first use, `nvcc -O3 -arch=sm_90 -shared` compiles the .cu file (about 2 s) into
$DECODEGAP_CACHE_DIR or ~/.cache/decodegap/ (one library per source hash and architecture; written to a temporary
name and renamed, so parallel processes are safe), and ctypes loads it. It needs no torch headers: it links the
CUDA runtime statically and launches on torch's current stream, so it works under CUDA-graph capture.
Fallback: where nvcc is missing, the build fails, the GPU is not sm_90, or DECODEGAP_MLA_CUDA=0, `applies()`
is False and mla_decode uses the portable Triton kernels (one warning says why, when a build was attempted).
DECODEGAP_MLA_CUDA=1 also tries other GPUs of compute capability 8.9 or newer (built for their architecture;
measured only on the H200).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("mla_decode_sm90.cu")
# Variants (DG_VARIANTS in the .cu file): 0 the default (pipelined, V by PRMT, 3 CTAs per SM), 1 V by movmatrix
# (2 CTAs per SM), 2 as 0 unpipelined.
VARIANTS = (0, 1, 2)
DEFAULT_VARIANT = 0


@dataclass(frozen=True)
class KernelInfo:
    variant: int
    block_n: int
    registers: int
    ctas_per_sm: int


def _nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _cache_dir() -> Path:
    root = os.environ.get("DECODEGAP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "decodegap")
    return Path(root)


def build(arch: str, nvcc: str | None = None) -> Path:
    """Compile the kernel library for `arch` (e.g. "sm_90") unless a build of this source exists."""
    nvcc = nvcc or _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set NVCC or CUDA_HOME)")
    src = _SOURCE.read_bytes()
    tag = hashlib.sha256(src + arch.encode()).hexdigest()[:16]
    lib = _cache_dir() / f"mla_decode_sm90_{arch}_{tag}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    cmd = [nvcc, "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC", "-o", tmp, str(_SOURCE)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed: {' '.join(cmd)}\n{res.stderr[-2000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _arch_allowed(cap: tuple[int, int]) -> bool:
    flag = os.environ.get("DECODEGAP_MLA_CUDA", "")
    if flag == "0":
        return False
    return cap == (9, 0) or (flag == "1" and cap >= (8, 9))


@functools.lru_cache(maxsize=None)
def _library(device_index: int):
    """The loaded library for this device, or None (with one warning when a build was tried and failed)."""
    cap = torch.cuda.get_device_capability(device_index)
    if not _arch_allowed(cap):
        return None
    try:
        lib = ctypes.CDLL(str(build(f"sm_{cap[0]}{cap[1]}")))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        warnings.warn(f"decodegap: the CUDA MLA decode kernel is unavailable, using Triton ({e})", stacklevel=3)
        return None
    lib.dg_mla_fp8_prepare.argtypes = [ctypes.c_int] + [ctypes.POINTER(ctypes.c_int)] * 3
    lib.dg_mla_fp8_prepare.restype = ctypes.c_int
    ll, i, f, p = ctypes.c_longlong, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    lib.dg_mla_fp8_launch.argtypes = [i, p, p, p, p, p, p, ll, ll, ll, ll, ll, i, i, i, i, f, f, p]
    lib.dg_mla_fp8_launch.restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=None)
def kernel_info(device_index: int, variant: int = DEFAULT_VARIANT) -> KernelInfo:
    """Registers and CTAs per SM of the compiled kernel (also sets its shared-memory limit, before any capture)."""
    lib = _library(device_index)
    if lib is None:
        raise RuntimeError("the CUDA MLA decode kernel is not available on this device")
    regs, per_sm, block_n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    with torch.cuda.device(device_index):
        err = lib.dg_mla_fp8_prepare(variant, ctypes.byref(regs), ctypes.byref(per_sm), ctypes.byref(block_n))
    if err != 0:
        raise RuntimeError(f"dg_mla_fp8_prepare failed: CUDA error {err}")
    return KernelInfo(variant, block_n.value, regs.value, max(1, per_sm.value))


def applies(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the fast path can run these arguments: FP8 cache, <= 16 heads, 16-byte aligned rows, a supported
    GPU, and a library that built."""
    if not (q.is_cuda and kv_cache.dtype == torch.float8_e4m3fn and 1 <= q.shape[1] <= 16):
        return False
    if kv_cache.data_ptr() % 16 or kv_cache.stride(0) % 16 or kv_cache.stride(1) % 16:
        return False
    return _library(q.device.index if q.device.index is not None else torch.cuda.current_device()) is not None


def launch_stage1(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                  part: torch.Tensor, part_lse: torch.Tensor, q_scale: float, s_scale: float,
                  num_splits: int, variant: int = DEFAULT_VARIANT) -> None:
    """Partials [B, H, S, 512] fp16 (sum(p v) / sum(p) in cache units: times kv_scale is the split's output)
    and their log2-sum-exp [B, H, S] fp32 (the Triton merge's layout) on the current stream. q must be
    contiguous; the scales are mla_decode_triton's (q * q_scale in fp16, scores * s_scale)."""
    batch, num_heads, _ = q.shape
    if part.dtype != torch.float16 or part_lse.dtype != torch.float32:
        raise TypeError("the CUDA stage 1 writes fp16 partials and fp32 lse")
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    kernel_info(device_index, variant)  # shared-memory limit set once, outside any capture
    lib = _library(device_index)
    err = lib.dg_mla_fp8_launch(
        variant, q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(),
        part.data_ptr(), part_lse.data_ptr(), q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0), num_heads, num_splits, batch, kv_cache.shape[1], q_scale, s_scale,
        torch.cuda.current_stream(q.device).cuda_stream)
    if err != 0:
        raise RuntimeError(f"the CUDA MLA decode kernel failed to launch: CUDA error {err}")
