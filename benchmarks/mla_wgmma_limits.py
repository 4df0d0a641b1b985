"""What bounds the 17+-head wgmma MLA decode kernel: each variant timed as built (probe 0), with the producer
publishing its stages unfilled (probe 1: the consumers alone, on zeros) and with the consumers releasing them
unread (probe 2: the producer alone: the copies, and for FP8 caches the widening). The default call
(mla_decode_triton, its split count and merge) with the kernel library swapped for a probe build
(mla_decode_sm90_wgmma.cu compiled with -DDG_WGMMA_PROBE=N); CUDA graph replay, L2 flushed as do_bench does.

    PYTHONPATH=src python3 benchmarks/mla_wgmma_limits.py [--shapes 32x4096:128,...] [--variants 18,20]

Prints a markdown table, µs per call. A variant whose probe-1 time is near its probe-0 time is bound by its
consumers (tensor work and softmax); near its probe-2 time, by its loads.
"""

from __future__ import annotations

import argparse
import ctypes
import sys

import torch

from bench_mla_decode import BF16, DEVICE, KV_SCALE, SM_SCALE, make_pools, time_graph
from decodegap.kernels import mla_decode_sm90 as sm90
from decodegap.kernels.mla_decode import HEAD_DIM
from decodegap.kernels.mla_decode_triton import mla_decode_triton, num_splits_for

PROBES = (0, 1, 2)


def probe_library(probe: int) -> ctypes.CDLL:
    gencode = sm90._WGMMA_GENCODE + ((f"-DDG_WGMMA_PROBE={probe}",) if probe else ())
    return sm90.bind_wgmma(ctypes.CDLL(str(sm90.build("sm_90a", source=sm90._WGMMA_SOURCE, gencode=gencode))))


def use_library(lib: ctypes.CDLL) -> None:
    """Route mla_decode_triton's wgmma launches to `lib` (module globals, looked up at call time)."""
    sm90._wgmma_library = lambda device_index: lib
    sm90.wgmma_info.cache_clear()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32x4096:128,128x16384:128,32x4096:64")
    ap.add_argument("--variants", default="18,20,8")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("mla_wgmma_limits: needs a CUDA GPU", file=sys.stderr)
        return 2
    libs = {p: probe_library(p) for p in PROBES}
    variants = [int(v) for v in args.variants.split(",")]
    print("| B | ctx | H | KV | variant | splits | as built | consumers alone (1) | producer alone (2) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        bc, heads = shape.split(":")
        batch, ctx = (int(x) for x in bc.split("x"))
        p = make_pools(batch, ctx, 64)
        q = torch.randn(batch, int(heads), HEAD_DIM, device=DEVICE).to(BF16)
        for v in variants:
            kv_dtype = sm90.WGMMA_VARIANTS[v]
            cache = p.fp8 if kv_dtype == torch.float8_e4m3fn else p.bf16
            cells = []
            for probe in PROBES:
                use_library(libs[probe])
                ms, _ = time_graph(lambda q=q, p=p, v=v, c=cache: mla_decode_triton(
                    q, c, p.table, p.lens, SM_SCALE, KV_SCALE, wgmma_variant=v))
                cells.append(f"{ms * 1e3:.1f}")
            kv = "fp8" if kv_dtype == torch.float8_e4m3fn else "bf16"
            print(f"| {batch} | {ctx} | {heads} | {kv} | {v} | {num_splits_for(q, cache, p.table)} | "
                  + " | ".join(cells) + " |", flush=True)
        p = q = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
