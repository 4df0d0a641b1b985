"""The CUDA fast paths on Hopper: FP8 caches with 1..16 heads (mla_decode_sm90.cu, mma.sync, bandwidth-bound) and
17+ heads on FP8 or BF16 caches (mla_decode_sm90_wgmma.cu, warpgroup MMA with 64 heads as M, compute-bound).
Both write split-KV partials that the Triton merge kernel combines (the wgmma kernel writes the output itself when
there is one split).

Build: at first use, `nvcc -O3 -arch=sm_90 -shared` compiles the .cu file (about 2 s; the wgmma file with
`-gencode=arch=compute_90a,code=sm_90a`, about 4 s) into
$DECODEGAP_CACHE_DIR or ~/.cache/decodegap/ (one library per source hash and architecture; written to a temporary
name and renamed, so parallel processes are safe), and ctypes loads it. It needs no torch headers: it links the
CUDA runtime statically and launches on torch's current stream, so it works under CUDA-graph capture.
Fallback: where nvcc is missing, the build fails, the GPU is not sm_90, or DECODEGAP_MLA_CUDA=0 (both kernels;
DECODEGAP_MLA_WGMMA=0 the wgmma one alone), `applies()` / `applies_wgmma()` are False and mla_decode uses the
portable Triton kernels (one warning says why, when a build was attempted).
DECODEGAP_MLA_CUDA=1 also tries the <= 16-head kernel on other GPUs of compute capability 8.9 or newer (built for
their architecture; measured only on the H200); the wgmma kernel needs sm_90 exactly (wgmma and setmaxnreg are
sm_90a instructions).
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
_WGMMA_SOURCE = Path(__file__).with_name("mla_decode_sm90_wgmma.cu")
_WGMMA_GENCODE = ("-gencode=arch=compute_90a,code=sm_90a",)
WGMMA_MIN_HEADS = 17  # fewer heads: the <= 16-head kernel (FP8) or Triton (BF16)
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


def build(arch: str, nvcc: str | None = None, source: Path = _SOURCE, gencode: tuple[str, ...] = ()) -> Path:
    """Compile the kernel library of `source` for `arch` (e.g. "sm_90"; `gencode` flags replace -arch) unless a
    build of this source exists."""
    nvcc = nvcc or _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set NVCC or CUDA_HOME)")
    src = source.read_bytes()
    tag = hashlib.sha256(src + arch.encode() + " ".join(gencode).encode()).hexdigest()[:16]
    lib = _cache_dir() / f"{source.stem}_{arch}_{tag}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    cmd = [nvcc, "-O3", "-std=c++17", *(gencode or (f"-arch={arch}",)), "-shared", "-Xcompiler", "-fPIC", "-o", tmp,
           str(source)]
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


# ----------------------------------------------------------------------------------------------------------
# The wgmma kernel (mla_decode_sm90_wgmma.cu): 17+ heads, FP8 or BF16 caches, sm_90 only.


# Variants (DG_WGMMA_CONFIGS in the .cu file): 0 BF16 caches (3 stages, cp.async); FP8 caches: 1 (2 stages + a
# cp.async raw ring) or 2 (3 stages, loads through registers a tile ahead). DECODEGAP_MLA_WGMMA_FP8 picks the FP8 one.
WGMMA_VARIANTS = {0: torch.bfloat16, 1: torch.float8_e4m3fn, 2: torch.float8_e4m3fn}
DEFAULT_WGMMA_FP8_VARIANT = 1  # the faster in the H200 A/B (125 vs 135 us, B=32 ctx 4096 H=128)


def default_wgmma_variant(kv_dtype: torch.dtype) -> int:
    if kv_dtype != torch.float8_e4m3fn:
        return 0
    return int(os.environ.get("DECODEGAP_MLA_WGMMA_FP8") or DEFAULT_WGMMA_FP8_VARIANT)


@functools.lru_cache(maxsize=None)
def _wgmma_library(device_index: int):
    """The loaded wgmma library for this device, or None (with one warning when a build was tried and failed)."""
    if "0" in (os.environ.get("DECODEGAP_MLA_CUDA", ""), os.environ.get("DECODEGAP_MLA_WGMMA", "")):
        return None  # DECODEGAP_MLA_WGMMA=0 switches off this kernel alone
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return None
    try:
        lib = ctypes.CDLL(str(build("sm_90a", source=_WGMMA_SOURCE, gencode=_WGMMA_GENCODE)))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        warnings.warn(f"decodegap: the wgmma MLA decode kernel is unavailable, using Triton ({e})", stacklevel=3)
        return None
    i, f, p, ll = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_longlong
    lib.dg_mla_wgmma_prepare.argtypes = [i] + [ctypes.POINTER(ctypes.c_int)] * 5
    lib.dg_mla_wgmma_prepare.restype = i
    lib.dg_mla_wgmma_launch.argtypes = [i, p, p, p, p, p, p, p, p] + [ll] * 7 + [i, i, i, i, f, f, f, p]
    lib.dg_mla_wgmma_launch.restype = i
    return lib


@functools.lru_cache(maxsize=None)
def wgmma_info(device_index: int, variant: int) -> KernelInfo:
    """Registers and CTAs per SM of a wgmma kernel variant; also sets its shared-memory limit, before any capture."""
    lib = _wgmma_library(device_index)
    if lib is None:
        raise RuntimeError("the wgmma MLA decode kernel is not available on this device")
    regs, per_sm, block_n, smem, fp8 = (ctypes.c_int() for _ in range(5))
    with torch.cuda.device(device_index):
        err = lib.dg_mla_wgmma_prepare(variant, ctypes.byref(regs), ctypes.byref(per_sm), ctypes.byref(block_n),
                                       ctypes.byref(smem), ctypes.byref(fp8))
    if err != 0:
        raise RuntimeError(f"dg_mla_wgmma_prepare({variant}) failed: CUDA error {err}")
    return KernelInfo(variant, block_n.value, regs.value, max(1, per_sm.value))


def applies_wgmma(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the wgmma kernel can run these arguments: 17+ heads, an FP8 or BF16 cache with 16-byte aligned rows,
    an sm_90 GPU, and a library that built."""
    if not (q.is_cuda and q.shape[1] >= WGMMA_MIN_HEADS and kv_cache.dtype in (torch.float8_e4m3fn, torch.bfloat16)):
        return False
    elem = kv_cache.element_size()
    if kv_cache.data_ptr() % 16 or (kv_cache.stride(0) * elem) % 16 or (kv_cache.stride(1) * elem) % 16:
        return False
    return _wgmma_library(q.device.index if q.device.index is not None else torch.cuda.current_device()) is not None


def launch_wgmma(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 part: torch.Tensor | None, part_lse: torch.Tensor | None, out: torch.Tensor,
                 lse: torch.Tensor | None, q_scale: float, s_scale: float, out_scale: float, num_splits: int,
                 variant: int | None = None) -> None:
    """The wgmma kernel on the current stream. num_splits > 1: partials [B, H, S, 512] (fp16 for an FP8 cache,
    fp32 for BF16; sum(p v) / sum(p) in cache units) and their log2-sum-exp [B, H, S] for the Triton merge;
    num_splits == 1: the bf16 output (times out_scale) and, when `lse` is given, the natural-log lse [B, H].
    q must be contiguous; the scales are mla_decode_triton's."""
    batch, num_heads, _ = q.shape
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    variant = default_wgmma_variant(kv_cache.dtype) if variant is None else variant
    if WGMMA_VARIANTS.get(variant) != kv_cache.dtype:
        raise ValueError(f"wgmma variant {variant} does not read a {kv_cache.dtype} cache")
    if num_splits > 1:
        want = torch.float16 if fp8 else torch.float32
        if part is None or part_lse is None or part.dtype != want or part_lse.dtype != torch.float32:
            raise TypeError(f"the wgmma kernel writes {want} partials and fp32 lse")
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    wgmma_info(device_index, variant)  # shared-memory limit set once, outside any capture
    lib = _wgmma_library(device_index)
    elem = kv_cache.element_size()
    err = lib.dg_mla_wgmma_launch(
        variant, q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(),
        part.data_ptr() if part is not None else None, part_lse.data_ptr() if part_lse is not None else None,
        out.data_ptr(), lse.data_ptr() if lse is not None else None, q.stride(0), q.stride(1),
        kv_cache.stride(0) * elem, kv_cache.stride(1) * elem, block_table.stride(0), out.stride(0), out.stride(1),
        num_heads, num_splits, batch, kv_cache.shape[1], q_scale, s_scale, out_scale,
        torch.cuda.current_stream(q.device).cuda_stream)
    if err != 0:
        raise RuntimeError(f"the wgmma MLA decode kernel failed to launch: CUDA error {err}")
