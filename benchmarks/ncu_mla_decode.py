"""A few eager MLA decode calls at one shape, for Nsight Compute (the kernels to profile are picked by ncu's -k).

    ncu --clock-control none -k regex:mla_decode --launch-skip 4 --launch-count 2 --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/ncu_mla_decode.py --batch 32 --ctx 4096 --heads 16 [--backend cuda|triton] [--variant 0]
"""

from __future__ import annotations

import argparse

import torch

from bench_mla_decode import BF16, DEVICE, HEAD_DIM, KV_SCALE, SM_SCALE, make_pools
from decodegap.kernels.mla_decode_triton import mla_decode_triton


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--cache", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--variant", type=int)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--inline-max", type=int, help="mla_decode_sm90.TOK_INLINE_MAX_SPLITS (0: always the merge kernel)")
    args = ap.parse_args()
    if args.inline_max is not None:
        from decodegap.kernels import mla_decode_sm90

        mla_decode_sm90.TOK_INLINE_MAX_SPLITS = args.inline_max
    p = make_pools(args.batch, args.ctx, 64)
    q = torch.randn(args.batch, args.heads, HEAD_DIM, device=DEVICE).to(BF16)
    cache = p.fp8 if args.cache == "fp8" else p.bf16
    for _ in range(args.calls):
        mla_decode_triton(q, cache, p.table, p.lens, SM_SCALE, KV_SCALE, backend=args.backend,
                          cuda_variant=args.variant)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
