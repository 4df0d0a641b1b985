"""What bounds the 17+-head wgmma MLA decode kernel: each variant timed as built (probe 0), with the producer
publishing its stages unfilled (probe 1: the consumers alone, on zeros) and with the consumers releasing them
unread (probe 2: the producer alone: the copies, and for FP8 caches the widening). The default call
(mla_decode_triton, its split count and merge) with the kernel library swapped for a probe build
(mla_decode_sm90_wgmma.cu compiled with -DDG_WGMMA_PROBE=N; for the tokens-major variants 41 and 42,
mla_decode_sm90_tok.cu with -DDG_TOK_PROBE=N, which also has probes 3-5: the consumers without the softmax, without
P.V, without the score products, and 6-8: the softmax without its proxy fence, without its vote, the tile without
the consumers' barrier); CUDA graph
replay, L2 flushed as do_bench does.

    PYTHONPATH=src python3 benchmarks/mla_wgmma_limits.py [--shapes 32x4096:128,...] [--variants 18,20]
        [--probes 0,1,2]

Prints a markdown table, µs per call (a probe the variant's source lacks: -). A variant whose probe-1 time is near
its probe-0 time is bound by its consumers (tensor work and softmax); near its probe-2 time, by its loads.
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

PROBES = (0, 1, 2, 3, 4, 5, 6, 7, 8)
PROBE_NAMES = ("as built", "consumers alone (1)", "producer alone (2)", "no softmax (3)", "no P.V (4)",
               "no scores (5)", "no proxy fence (6)", "no vote (7)", "no barrier a tile (8)")
WGMMA_PROBES = (0, 1, 2)  # mla_decode_sm90_wgmma.cu's; the tokens-major source has all of PROBES


def probe_library(probe: int, tok: bool) -> ctypes.CDLL:
    macro = "DG_TOK_PROBE" if tok else "DG_WGMMA_PROBE"
    gencode = sm90._WGMMA_GENCODE + ((f"-D{macro}={probe}",) if probe else ())
    source = sm90._TOK_SOURCE if tok else sm90._WGMMA_SOURCE
    lib = ctypes.CDLL(str(sm90.build("sm_90a", source=source, gencode=gencode)))
    return sm90.bind_tok(lib) if tok else sm90.bind_wgmma(lib)


def use_library(lib: ctypes.CDLL, tok: bool) -> None:
    """Route mla_decode_triton's wgmma (or tokens-major) launches to `lib` (module globals, looked up at call
    time)."""
    if tok:
        sm90._tok_library = lambda device_index: lib
    else:
        sm90._wgmma_library = lambda device_index: lib
    sm90.wgmma_info.cache_clear()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32x4096:128,128x16384:128,32x4096:64")
    ap.add_argument("--variants", default="18,20,8")
    ap.add_argument("--probes", default=",".join(map(str, PROBES)))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("mla_wgmma_limits: needs a CUDA GPU", file=sys.stderr)
        return 2
    variants = [int(v) for v in args.variants.split(",")]
    kinds = {v in sm90.TOKW_VARIANTS for v in variants}
    probes = [int(p) for p in args.probes.split(",")]
    libs = {(p, tok): probe_library(p, tok) for tok in kinds for p in probes if tok or p in WGMMA_PROBES}
    print("| B | ctx | H | KV | variant | splits | " + " | ".join(PROBE_NAMES[p] for p in probes) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(probes))
    for shape in args.shapes.split(","):
        bc, heads = shape.split(":")
        batch, ctx = (int(x) for x in bc.split("x"))
        p = make_pools(batch, ctx, 64)
        q = torch.randn(batch, int(heads), HEAD_DIM, device=DEVICE).to(BF16)
        for v in variants:
            kv_dtype = sm90.WGMMA_VARIANTS[v]
            cache = p.fp8 if kv_dtype == torch.float8_e4m3fn else p.bf16
            cells, tok = [], v in sm90.TOKW_VARIANTS
            for probe in probes:
                if (probe, tok) not in libs:
                    cells.append("-")
                    continue
                use_library(libs[probe, tok], tok)
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
