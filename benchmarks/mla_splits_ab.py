"""The default MLA decode path (mla_decode_triton, every kernel choice left to it) timed at several fixed split
counts beside the heuristic's own (CUDA graph replay, L2 flushed as do_bench does), on one GPU: where the split
model (mla_decode_triton.pick_num_splits) leaves time on the table.

    PYTHONPATH=src python3 benchmarks/mla_splits_ab.py [--shapes 1x4096:128:bf16,...] [--splits 8,16,24,...]

Prints a markdown table, µs per call; splits past the table's tiles are skipped.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench_mla_decode import BF16, DEVICE, KV_SCALE, SM_SCALE, make_pools, time_graph
from decodegap.kernels.mla_decode import HEAD_DIM
from decodegap.kernels.mla_decode_triton import cuda_path, mla_decode_triton, num_splits_for


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x4096:128:bf16,1x4096:128:fp8,1x4096:64:bf16,8x4096:128:bf16")
    ap.add_argument("--splits", default="8,12,16,24,32,48,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("mla_splits_ab: needs a CUDA GPU", file=sys.stderr)
        return 2
    counts = [int(s) for s in args.splits.split(",")]
    print("| B | ctx | H | KV | path | heuristic splits: µs | " + " | ".join(f"{s} splits" for s in counts) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(counts))
    for shape in args.shapes.split(","):
        bc, heads, kv = shape.split(":")
        batch, ctx = (int(x) for x in bc.split("x"))
        p = make_pools(batch, ctx, 64)
        cache = p.fp8 if kv == "fp8" else p.bf16
        q = torch.randn(batch, int(heads), HEAD_DIM, device=DEVICE).to(BF16)
        own = num_splits_for(q, cache, p.table)
        cells = []
        for s in [own, *counts]:
            if s > ctx // 32:
                cells.append("-")
                continue
            ms, _ = time_graph(lambda s=s, q=q, c=cache, t=p.table, n=p.lens: mla_decode_triton(
                q, c, t, n, SM_SCALE, KV_SCALE, num_splits=s))
            cells.append(f"{ms * 1e3:.1f}")
        print(f"| {batch} | {ctx} | {heads} | {kv} | {cuda_path(q, cache) or 'triton'} | {own}: {cells[0]} | "
              + " | ".join(cells[1:]) + " |", flush=True)
        p = q = cache = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
