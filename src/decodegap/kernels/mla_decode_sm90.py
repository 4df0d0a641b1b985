"""The CUDA fast paths on Hopper: FP8 caches with 1..16 heads (mla_decode_sm90_tok.cu, FP8 wgmma with the tokens as
M, bandwidth-bound; the older mma.sync kernel mla_decode_sm90.cu stays as variants 0-2 and as the fallback where
the wgmma build is unavailable) and 17+ heads on FP8 or BF16 caches (mla_decode_sm90_wgmma.cu, warpgroup MMA with
64 heads as M, compute-bound). They write split-KV partials that the Triton merge kernel combines (the wgmma
kernel writes the output itself when there is one split; the tokens-major kernel combines up to
TOK_CLUSTER_MAX_SPLITS splits itself, the splits of a sequence being one thread-block cluster that merges its
partials through distributed shared memory, so no partials reach HBM and no merge kernel runs; it can also combine
up to TOK_INLINE_MAX_SPLITS splits by the last CTA of each sequence merging the others' partials from HBM: off by
default, measured slower than the merge kernel).

Build: at first use, `nvcc -O3 -shared` compiles the .cu file (`-arch=sm_90` for the mma.sync file, about 2 s; the
wgmma files with `-gencode=arch=compute_90a,code=sm_90a`, about 4 s each) into
$DECODEGAP_CACHE_DIR or ~/.cache/decodegap/ (one library per source hash and architecture; written to a temporary
name and renamed, so parallel processes are safe), and ctypes loads it. It needs no torch headers: it links the
CUDA runtime statically and launches on torch's current stream, so it works under CUDA-graph capture.
Fallback: where nvcc is missing, the build fails, the GPU is not sm_90, or DECODEGAP_MLA_CUDA=0 (all kernels;
DECODEGAP_MLA_WGMMA=0 the two wgmma ones), `applies()` / `applies_wgmma()` are False and mla_decode uses the
portable Triton kernels (one warning says why, when a build was attempted).
DECODEGAP_MLA_CUDA=1 also tries the <= 16-head mma.sync kernel on other GPUs of compute capability 8.9 or newer
(built for their architecture; measured only on the H200); the wgmma kernels need sm_90 exactly (wgmma and
setmaxnreg are sm_90a instructions).
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
_TOK_SOURCE = Path(__file__).with_name("mla_decode_sm90_tok.cu")
_COMMON_HEADER = Path(__file__).with_name("mla_decode_sm90_common.cuh")  # included by the three .cu files
_WGMMA_GENCODE = ("-gencode=arch=compute_90a,code=sm_90a",)
WGMMA_MIN_HEADS = 17  # fewer heads: the <= 16-head kernel (FP8) or Triton (BF16)
# Variants of the <= 16-head FP8 path: 0-2 the mma.sync kernel (DG_VARIANTS in mla_decode_sm90.cu: 0 pipelined, V
# by PRMT, 3 CTAs per SM; 1 V by movmatrix, 2 CTAs per SM; 2 as 0 unpipelined), 3 and 4 the tokens-major wgmma
# kernel (mla_decode_sm90_tok.cu; 3: TMA loads where the page size allows, else cp.async; 4: cp.async always), 3
# the default where it builds (sm_90); default_variant() says which one runs.
VARIANTS = (0, 1, 2, 3, 4)
TOK_VARIANT = 3
TOK_VARIANTS = {3: 0, 4: 1}  # -> the variant argument of dg_mla_tok_*
MMA_DEFAULT_VARIANT = 0
# The tokens-major kernel can combine up to this many splits itself (its last CTA per sequence merging the others'
# partials, counted on per-call zeroed counters) instead of the Triton merge; 0 = never. Off by default: on the
# H200 it measured slower than the merge kernel at every shape (B=32 ctx 4096: 45.8 vs 40.9 µs; the zeroing and the
# last CTA's tail cost more than the second launch saves).
TOK_INLINE_MAX_SPLITS = 0
# The tokens-major kernel's cluster combine: a sequence's splits (at most this many, the portable cluster size) run
# as one cluster of CTAs that merge their partials through distributed shared memory at the end (no partials in
# HBM, no merge kernel); used where it costs no extra wave of clusters. 0 (or DECODEGAP_MLA_TOK_CLUSTER=0): never.
TOK_CLUSTER_MAX_SPLITS = 8
# Problems smaller than this many KV slots (batch x table span) run the mma.sync kernel. 2026-12-01 it was 16,384
# (4,096 slots, B=1 ctx 4096: 13.2 µs mma.sync vs 14.9 tokens-major). With the merge as a programmatic dependent
# launch and, on problems of at most one tile per two SMs, slices of one tile (mla_decode_triton._cuda_splits), the
# tokens-major kernel is the faster one at every size measured on the H200, H=16
# (benchmarks/results/mla_decode_h200_2026-12-02-pdl.md, call 2; µs, mma.sync vs tokens-major): B=1 ctx 1024 12.4 vs
# 10.9, ctx 2048 13.0 vs 11.3, ctx 4096 13.2 vs 11.8, ctx 8192 15.8 vs 13.8, B=2 ctx 4096 15.0 vs 13.3, B=4 19.6 vs
# 15.7; smaller problems were not measured and keep the mma.sync kernel.
TOK_MIN_SLOTS = 1024


@dataclass(frozen=True)
class KernelInfo:
    variant: int
    block_n: int
    registers: int
    ctas_per_sm: int
    max_inline_splits: int = 0  # the tokens-major kernel: the most splits it can combine itself


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
    build of this source (and of the shared header it includes) exists."""
    nvcc = nvcc or _nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set NVCC or CUDA_HOME)")
    src = source.read_bytes() + _COMMON_HEADER.read_bytes()
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


def _load_sm90a(device_index: int, source: Path, unavailable: str):
    """One of the warpgroup-MMA libraries built for sm_90a and loaded, or None: not an sm_90 device,
    DECODEGAP_MLA_CUDA=0 or DECODEGAP_MLA_WGMMA=0 (these kernels alone off), or a failed build (one warning)."""
    if "0" in (os.environ.get("DECODEGAP_MLA_CUDA", ""), os.environ.get("DECODEGAP_MLA_WGMMA", "")):
        return None
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return None
    try:
        return ctypes.CDLL(str(build("sm_90a", source=source, gencode=_WGMMA_GENCODE)))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        warnings.warn(f"decodegap: {unavailable} ({e})", stacklevel=4)
        return None


@functools.lru_cache(maxsize=None)
def _tok_library(device_index: int):
    """The loaded tokens-major wgmma library (<= 16 heads, FP8) for this device, or None (with one warning when a
    build was tried and failed)."""
    lib = _load_sm90a(device_index, _TOK_SOURCE, "the tokens-major MLA decode kernel is unavailable")
    return None if lib is None else bind_tok(lib)


def bind_tok(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of a loaded tokens-major library's entry points (also for the probe builds of
    benchmarks/mla_wgmma_limits.py)."""
    i, f, p, ll = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_longlong
    lib.dg_mla_tok_prepare.argtypes = [i] + [ctypes.POINTER(ctypes.c_int)] * 5
    lib.dg_mla_tok_prepare.restype = i
    lib.dg_mla_tok_launch.argtypes = [i] + [p] * 9 + [ll] * 7 + [i] * 4 + [ll, f, f, p, ctypes.POINTER(i), i, i]
    lib.dg_mla_tok_launch.restype = i
    lib.dg_mla_tok_max_clusters.argtypes = [i, i, ctypes.POINTER(i)]
    lib.dg_mla_tok_max_clusters.restype = i
    lib.dg_mla_tokw_prepare.argtypes = [ctypes.POINTER(i)] * 4
    lib.dg_mla_tokw_prepare.restype = i
    lib.dg_mla_tokw_applies.argtypes = [p, i, ll, ll]
    lib.dg_mla_tokw_applies.restype = i
    lib.dg_mla_tokw_launch.argtypes = [p] * 6 + [ll] * 5 + [i] * 4 + [ll, f, i, p]
    lib.dg_mla_tokw_launch.restype = i
    return lib


def default_variant(device_index: int, slots: int | None = None) -> int:
    """The <= 16-head FP8 kernel mla_decode runs on this device for `slots` KV slots (batch x table span; None: a
    large problem): the tokens-major one where it builds and the problem has at least TOK_MIN_SLOTS slots, else
    the mma.sync one. DECODEGAP_MLA_FP8_VARIANT=N forces variant N (for A/B runs, e.g. the demo)."""
    forced = os.environ.get("DECODEGAP_MLA_FP8_VARIANT", "")
    if forced:
        if int(forced) not in VARIANTS:
            raise ValueError(f"DECODEGAP_MLA_FP8_VARIANT must be one of {VARIANTS}; got {forced!r}")
        return int(forced)
    if slots is not None and slots < TOK_MIN_SLOTS:
        return MMA_DEFAULT_VARIANT
    return TOK_VARIANT if _tok_library(device_index) is not None else MMA_DEFAULT_VARIANT


@functools.lru_cache(maxsize=None)
def kernel_info(device_index: int, variant: int = MMA_DEFAULT_VARIANT) -> KernelInfo:
    """Registers and CTAs per SM of the compiled kernel (also sets its shared-memory limit, before any capture)."""
    regs, per_sm, block_n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if variant in TOK_VARIANTS:
        lib = _tok_library(device_index)
        if lib is None:
            raise RuntimeError("the tokens-major MLA decode kernel is not available on this device")
        smem, inline = ctypes.c_int(), ctypes.c_int()
        with torch.cuda.device(device_index):
            err = lib.dg_mla_tok_prepare(TOK_VARIANTS[variant], ctypes.byref(regs), ctypes.byref(per_sm),
                                         ctypes.byref(block_n), ctypes.byref(smem), ctypes.byref(inline))
        if err != 0:
            raise RuntimeError(f"dg_mla_tok_prepare failed: CUDA error {err}")
        return KernelInfo(variant, block_n.value, regs.value, max(1, per_sm.value), inline.value)
    lib = _library(device_index)
    if lib is None:
        raise RuntimeError("the CUDA MLA decode kernel is not available on this device")
    with torch.cuda.device(device_index):
        err = lib.dg_mla_fp8_prepare(variant, ctypes.byref(regs), ctypes.byref(per_sm), ctypes.byref(block_n))
    if err != 0:
        raise RuntimeError(f"dg_mla_fp8_prepare failed: CUDA error {err}")
    return KernelInfo(variant, block_n.value, regs.value, max(1, per_sm.value))


@functools.lru_cache(maxsize=None)
def tok_max_clusters(device_index: int, variant: int, splits: int) -> int:
    """How many clusters of `splits` CTAs of the tokens-major kernel (its cluster combine) fit on the GPU at once."""
    kernel_info(device_index, variant)  # the shared-memory limit is set first
    lib = _tok_library(device_index)
    out = ctypes.c_int()
    with torch.cuda.device(device_index):
        err = lib.dg_mla_tok_max_clusters(TOK_VARIANTS[variant], splits, ctypes.byref(out))
    return out.value if err == 0 else 0


def tok_cluster_combine(device_index: int, variant: int, splits: int, batch: int) -> bool:
    """Whether the tokens-major kernel combines its `splits` splits itself as one cluster per sequence: at most
    TOK_CLUSTER_MAX_SPLITS (DECODEGAP_MLA_TOK_CLUSTER=0: never), and only where the clusters take no more waves than
    the same CTAs without clusters would."""
    if os.environ.get("DECODEGAP_MLA_TOK_CLUSTER", "") == "0" or not 1 <= splits <= TOK_CLUSTER_MAX_SPLITS:
        return False
    clusters = tok_max_clusters(device_index, variant, splits)
    if clusters < 1:
        return False
    info = kernel_info(device_index, variant)
    slots = info.ctas_per_sm * torch.cuda.get_device_properties(device_index).multi_processor_count
    return -(-batch // clusters) <= -(-(batch * splits) // slots)


def applies(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the fast path can run these arguments: FP8 cache, <= 16 heads, 16-byte aligned rows, a supported
    GPU, and a library that built."""
    if not (q.is_cuda and kv_cache.dtype == torch.float8_e4m3fn and 1 <= q.shape[1] <= 16):
        return False
    if kv_cache.data_ptr() % 16 or kv_cache.stride(0) % 16 or kv_cache.stride(1) % 16:
        return False
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return _library(device_index) is not None or _tok_library(device_index) is not None


def launch_stage1(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                  part: torch.Tensor, part_lse: torch.Tensor, q_scale: float, s_scale: float,
                  num_splits: int, variant: int = MMA_DEFAULT_VARIANT) -> None:
    """Partials [B, H, S, 512] fp16 (sum(p v) / sum(p) in cache units: times kv_scale is the split's output)
    and their log2-sum-exp [B, H, S] fp32 (the Triton merge's layout) on the current stream. q must be
    contiguous; the scales are mla_decode_triton's (q * q_scale in fp16, scores * s_scale). The mma.sync variants
    (0-2); the tokens-major one is launch_tok."""
    batch, num_heads, _ = q.shape
    if variant in TOK_VARIANTS:
        raise ValueError(f"variant {variant} (tokens-major) runs through launch_tok")
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


def launch_tok(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
               part: torch.Tensor | None, part_lse: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None,
               counters: torch.Tensor | None, qk_scale: float, out_scale: float, num_splits: int,
               variant: int = TOK_VARIANT, cluster: bool = False) -> bool:
    """The tokens-major kernel (FP8, <= 16 heads) on the current stream: partials [B, H, S, 512] fp16 (sum(p v) /
    sum(p) in cache units) and their log2-sum-exp [B, H, S] fp32; with `counters` (int32 [>= B], zeros), also the
    combine: the bf16 output (times out_scale) and, when `lse` is given, the natural-log lse [B, H]. With
    `cluster` (1 <= num_splits <= TOK_CLUSTER_MAX_SPLITS), no partials: each sequence's splits combine as one
    cluster and write the output and lse. q must be contiguous; qk_scale = sm_scale * kv_scale * log2(e). Returns
    whether the loads ran through TMA."""
    batch, num_heads, _ = q.shape
    if cluster:
        if counters is not None or not 1 <= num_splits <= TOK_CLUSTER_MAX_SPLITS:
            raise ValueError(f"the cluster combine takes 1..{TOK_CLUSTER_MAX_SPLITS} splits and no counters")
    elif part is None or part_lse is None or part.dtype != torch.float16 or part_lse.dtype != torch.float32:
        raise TypeError("the tokens-major kernel writes fp16 partials and fp32 lse")
    if counters is not None and (counters.dtype != torch.int32 or counters.numel() < batch):
        raise TypeError("counters must be int32 zeros, one per sequence")
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    kernel_info(device_index, variant)  # shared-memory limit set once, outside any capture
    lib = _tok_library(device_index)
    used_tma = ctypes.c_int()
    err = lib.dg_mla_tok_launch(
        TOK_VARIANTS[variant], q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(),
        part.data_ptr() if part is not None else None, part_lse.data_ptr() if part_lse is not None else None,
        out.data_ptr(), lse.data_ptr() if lse is not None else None,
        counters.data_ptr() if counters is not None else None, q.stride(0), q.stride(1), kv_cache.stride(0),
        kv_cache.stride(1), block_table.stride(0), out.stride(0), out.stride(1), num_heads, num_splits, batch,
        kv_cache.shape[1], kv_cache.shape[0], qk_scale, out_scale, torch.cuda.current_stream(q.device).cuda_stream,
        ctypes.byref(used_tma), int(cluster), block_table.shape[1] * kv_cache.shape[1])
    if err != 0:
        raise RuntimeError(f"the tokens-major MLA decode kernel failed to launch: CUDA error {err}")
    return bool(used_tma.value)


# ----------------------------------------------------------------------------------------------------------
# The wgmma kernel (mla_decode_sm90_wgmma.cu): 17+ heads, FP8 or BF16 caches, sm_90 only.


# Variants (DG_WGMMA_CONFIGS in the .cu file): BF16 caches: 0 (3 stages, cp.async, Q in shared memory), 6 and 7
# (14 of each consumer's 18 score k-steps with Q in registers, 3 / 4 stages), 19 (the seesaw consumers: each
# warpgroup the full scores of every other tile; 4 stages); FP8 caches: 1 (2 stages + a cp.async raw ring), 2 (3
# stages, loads through registers a tile ahead), 3-5 (as 1 with 14 of 18 k-steps' Q in registers; 2 stages, 3
# stages, 3 stages + a 3-deep raw ring), 8 (as 3 with 16 of 18), 18 (the seesaw; 4 stages, loads through registers
# a pair of tiles ahead), 20 (BF16: as 19 with the first 8 of the 36 score k-steps' Q in registers), 23 (as 20 with
# each whole tile loaded by TMA from one producer thread, where the pages hold a multiple of 32 slots, the tile that
# crosses the slice's end by cp.async; elsewhere it runs as 20). The earlier software-pipelined seesaws (then
# 23-27) were slower at every shape and are gone (mla_decode_h200_2026-12-02-pdl.md), as are the 64-token tiles
# (28-31 the seesaw, 32 a lockstep; mla_decode_h200_2026-12-02-blocks64.md), the lead/follow seesaws (46, 47,
# 50-53; mla_decode_h200_2026-12-03-leadfollow.md) and, for BF16, TMA multicast (21, 22), TMA with 5 stages (25) and
# TMA with the lead/follow consumers (24; mla_decode_h200_2026-12-03-tma.md).
# DECODEGAP_MLA_WGMMA_FP8 / DECODEGAP_MLA_WGMMA_BF16 pick one.
# 41 and 42 (FP8) are not in that file: they are the tokens-major tile of mla_decode_sm90_tok.cu for 64 heads per
# CTA (mla_decode_tok_wide_sm90: a TMA producer warp, two consumer warpgroups of 32 heads taking turns to issue their
# score products; FP8 scores straight from the stage, V^T widened in registers), for page sizes TMA can read (16, 32
# or a multiple of 64 slots); elsewhere they run as 18 (65+ heads) or 8. 41 accumulates P.V by heads (each consumer
# its 32 heads, all 512 dims); 42 by output dims (each consumer 256 dims of all 64 heads, so it widens half of V;
# P^T and the moves of the reference max exchanged every tile). Tried beside them and removed: 40, 41 with the
# consumers running free, 1-2% slower (benchmarks/results/mla_decode_h100_2026-12-06.md).
TOKW_VARIANTS = {41: 0, 42: 1}  # -> dg_mla_tokw_launch's dimsplit argument
WGMMA_VARIANTS = {0: torch.bfloat16, 1: torch.float8_e4m3fn, 2: torch.float8_e4m3fn, 3: torch.float8_e4m3fn,
                  4: torch.float8_e4m3fn, 5: torch.float8_e4m3fn, 6: torch.bfloat16, 7: torch.bfloat16,
                  8: torch.float8_e4m3fn, 18: torch.float8_e4m3fn, 19: torch.bfloat16, 20: torch.bfloat16,
                  23: torch.bfloat16, 41: torch.float8_e4m3fn, 42: torch.float8_e4m3fn}
# H200 A/B of 2026-12-02 (benchmarks/results/mla_decode_h200_2026-12-02-seesaw.md, call 4): BF16: 19 at every
# head count, 93.7 vs 109.0 us (variant 0) at B=32 ctx 4096 H=128, 1326 vs 1500 at B=128 ctx 16384, 67.1 vs 69.3
# at H=64, 62.3 vs 64.2 at H=32, 25.5 vs 26.8 at B=1. FP8: 18 with more than 64 heads (two head blocks, the second
# CTA's KV reads hitting L2): 104.9 vs 105.3-105.8 at B=32 ctx 4096 H=128, 1281 vs 1311-1320 at B=128 ctx 16384,
# 28.2 vs 29.3-29.7 at B=1; else 8 (variant 18 69.5 vs 67.0-67.5 at H=64, 61.2 vs 56.8 at H=32: its producer's
# widening, a pair of tiles in flight, falls behind when every KV byte comes from HBM).
# Then FP8: the tokens-major many-head tile at every head count where TMA can copy the pages (2026-12-06, one H100,
# benchmarks/results/mla_decode_h100_2026-12-06.md): 41, call 2: B=32 ctx 4096 H=128 85.5 vs 107.9 us (18), B=128
# ctx 16384 1169 vs 1267-1291, H=64 55.6 vs 73.3, H=32 53.2 vs 64.1, B=1 19.4 vs 27.4; then 42, call 3: 85.5 vs 89.2
# (41) vs 107.3-107.9 (18), 1148.5 vs 1199.5 vs 1292.5-1295.6, H=64 56.2 vs 57.4, H=32 53.5 vs 55.5, but B=1 21.6 vs
# 20.2 (slices of two tiles: its exchanges cost more than the halved widening saves). 18 and 8 stay for other page
# sizes.
DEFAULT_WGMMA_FP8_VARIANT = 42
FP8_UNTILED_VARIANT = 8  # where TMA cannot copy the pages (e.g. SGLang's page size 1)
FP8_UNTILED_MANY_HEADS_VARIANT = 18  # the same, from WGMMA_FP8_SEESAW_MIN_HEADS heads
WGMMA_FP8_SEESAW_MIN_HEADS = 65
# BF16: 20 (2026-12-02, mla_decode_h200_2026-12-02-pdl.md, call 1): B=128 ctx 16384 H=128 1264.7 vs 1328.4 / 1278.3
# us (variant 19, twice), B=32 ctx 4096 H=128 92.7 vs 93.0 / 93.7, H=64 67.3 vs 67.3, B=1 25.0 vs 25.2.
# Then 23 (2026-12-03, mla_decode_h200_2026-12-03-tma.md, the crossing tile by cp.async): B=32 ctx 4096 H=128 90.1
# vs 93.2 / 94.3 us (20), B=128 ctx 16384 1256 vs 1357 / 1359, H=64 66.7 vs 67.7, H=32 61.7 vs 63.7, B=1 23.2 vs
# 23.2; where the page size is not a multiple of 32 it runs as 20.
DEFAULT_WGMMA_BF16_VARIANT = 23


def default_wgmma_variant(kv_dtype: torch.dtype, num_heads: int | None = None, tma_pages: bool = True) -> int:
    """The wgmma variant mla_decode runs for this cache and head count (None: many heads); `tma_pages` False: for
    a cache whose pages TMA cannot copy (variant 41 is then never the answer)."""
    if kv_dtype != torch.float8_e4m3fn:
        return int(os.environ.get("DECODEGAP_MLA_WGMMA_BF16") or DEFAULT_WGMMA_BF16_VARIANT)
    forced = os.environ.get("DECODEGAP_MLA_WGMMA_FP8")
    if forced and (tma_pages or int(forced) not in TOKW_VARIANTS):
        return int(forced)
    if tma_pages:
        return DEFAULT_WGMMA_FP8_VARIANT
    many = num_heads is None or num_heads >= WGMMA_FP8_SEESAW_MIN_HEADS
    return FP8_UNTILED_MANY_HEADS_VARIANT if many else FP8_UNTILED_VARIANT


@functools.lru_cache(maxsize=None)
def _wgmma_library(device_index: int):
    """The loaded wgmma library for this device, or None (with one warning when a build was tried and failed)."""
    lib = _load_sm90a(device_index, _WGMMA_SOURCE, "the wgmma MLA decode kernel is unavailable, using Triton")
    return None if lib is None else bind_wgmma(lib)


def bind_wgmma(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of a loaded wgmma library's entry points (also for the probe builds of
    benchmarks/mla_wgmma_limits.py)."""
    i, f, p, ll = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_longlong
    lib.dg_mla_wgmma_prepare.argtypes = [i] + [ctypes.POINTER(ctypes.c_int)] * 5
    lib.dg_mla_wgmma_prepare.restype = i
    lib.dg_mla_wgmma_launch.argtypes = [i, p, p, p, p, p, p, p, p] + [ll] * 7 + [i, i, i, i, f, f, f, p, ll,
                                                                                ctypes.POINTER(i)]
    lib.dg_mla_wgmma_launch.restype = i
    return lib


@functools.lru_cache(maxsize=None)
def wgmma_info(device_index: int, variant: int) -> KernelInfo:
    """Registers and CTAs per SM of a wgmma kernel variant; also sets its shared-memory limit, before any capture."""
    if variant in TOKW_VARIANTS:
        return _tokw_info(device_index, variant)
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


def _tokw_info(device_index: int, variant: int) -> KernelInfo:
    lib = _tok_library(device_index)
    if lib is None:
        raise RuntimeError("the tokens-major MLA decode kernel is not available on this device")
    regs, per_sm, block_n, smem = (ctypes.c_int() for _ in range(4))
    with torch.cuda.device(device_index):
        err = lib.dg_mla_tokw_prepare(ctypes.byref(regs), ctypes.byref(per_sm), ctypes.byref(block_n),
                                      ctypes.byref(smem))
    if err != 0:
        raise RuntimeError(f"dg_mla_tokw_prepare failed: CUDA error {err}")
    return KernelInfo(variant, block_n.value, regs.value, max(1, per_sm.value))


def wgmma_variant_runs(variant: int, kv_cache: torch.Tensor) -> bool:
    """Whether `variant` can read this cache as it is (variants 41, 42 need pages TMA can copy, and their
    library)."""
    if variant not in TOKW_VARIANTS:
        return True
    lib = _tok_library(kv_cache.device.index if kv_cache.device.index is not None else torch.cuda.current_device())
    return lib is not None and bool(lib.dg_mla_tokw_applies(kv_cache.data_ptr(), kv_cache.shape[1],
                                                            kv_cache.stride(0), kv_cache.stride(1)))


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
                 variant: int | None = None) -> bool:
    """The wgmma kernel on the current stream. num_splits > 1: partials [B, H, S, 512] (fp16 for an FP8 cache,
    fp32 for BF16; sum(p v) / sum(p) in cache units) and their log2-sum-exp [B, H, S] for the Triton merge;
    num_splits == 1: the bf16 output (times out_scale) and, when `lse` is given, the natural-log lse [B, H].
    q must be contiguous; the scales are mla_decode_triton's. Returns whether its loads ran through TMA (the TMA
    variants where the cache allows)."""
    batch, num_heads, _ = q.shape
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    variant = default_wgmma_variant(kv_cache.dtype, num_heads) if variant is None else variant
    if WGMMA_VARIANTS.get(variant) != kv_cache.dtype:
        raise ValueError(f"wgmma variant {variant} does not read a {kv_cache.dtype} cache")
    if num_splits > 1 or variant in TOKW_VARIANTS:
        want = torch.float16 if fp8 else torch.float32
        if part is None or part_lse is None or part.dtype != want or part_lse.dtype != torch.float32:
            raise TypeError(f"the wgmma kernel writes {want} partials and fp32 lse")
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    wgmma_info(device_index, variant)  # shared-memory limit set once, outside any capture
    if variant in TOKW_VARIANTS:
        return _launch_tokw(q, kv_cache, block_table, seq_lens, part, part_lse, q_scale * s_scale, num_splits,
                            TOKW_VARIANTS[variant])
    lib = _wgmma_library(device_index)
    elem = kv_cache.element_size()
    used_tma = ctypes.c_int()
    err = lib.dg_mla_wgmma_launch(
        variant, q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(),
        part.data_ptr() if part is not None else None, part_lse.data_ptr() if part_lse is not None else None,
        out.data_ptr(), lse.data_ptr() if lse is not None else None, q.stride(0), q.stride(1),
        kv_cache.stride(0) * elem, kv_cache.stride(1) * elem, block_table.stride(0), out.stride(0), out.stride(1),
        num_heads, num_splits, batch, kv_cache.shape[1], q_scale, s_scale, out_scale,
        torch.cuda.current_stream(q.device).cuda_stream, kv_cache.shape[0], ctypes.byref(used_tma))
    if err != 0:
        raise RuntimeError(f"the wgmma MLA decode kernel failed to launch: CUDA error {err}")
    return bool(used_tma.value)


def _launch_tokw(q, kv_cache, block_table, seq_lens, part, part_lse, qk_scale: float, num_splits: int,
                 dimsplit: int) -> bool:
    """Variants 41, 42: fp16 partials and their log2-sum-exp for every split count (the merge writes the output)."""
    lib = _tok_library(q.device.index if q.device.index is not None else torch.cuda.current_device())
    err = lib.dg_mla_tokw_launch(
        q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(), part.data_ptr(),
        part_lse.data_ptr(), q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        q.shape[1], num_splits, q.shape[0], kv_cache.shape[1], kv_cache.shape[0], qk_scale, dimsplit,
        torch.cuda.current_stream(q.device).cuda_stream)
    if err != 0:
        raise RuntimeError(f"the tokens-major many-head MLA decode kernel failed to launch: CUDA error {err}")
    return True
