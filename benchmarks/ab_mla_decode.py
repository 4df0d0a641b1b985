"""Quick A/B of Triton tile variants on a GPU: FP8 (and one BF16 row) at B=32 ctx 4096 and B=128 ctx 16384.

    PYTHONPATH=src python3 benchmarks/ab_mla_decode.py [--heads 16 128]
"""

from __future__ import annotations

import argparse

import torch

from bench_mla_decode import BF16, FP8, HEAD_DIM, KV_SCALE, SM_SCALE, bytes_moved, copy_bandwidth_gbps, \
    make_pools, time_graph
from decodegap.kernels.mla_decode import gather_cast, reference
from decodegap.kernels.mla_decode_triton import Config, _num_sms, mla_decode_triton, pick_num_splits

H16 = {
    "old qKt bf16-widen N32 w4 s2": Config(16, 32, 4, 2, kt=True, widen="bf16"),
    "qKt fp16 N32 w4 s2": Config(16, 32, 4, 2, kt=True),
    "qKt fp16 N64 w4 s2": Config(16, 64, 4, 2, kt=True),
    "qKt fp16 N32 w8 s2": Config(16, 32, 8, 2, kt=True),
    "qKt reuse fp16 N32 w4 s2": Config(16, 32, 4, 2, kt=True, reuse_v=True),
    "qKt reuse fp16 N64 w4 s2": Config(16, 64, 4, 2, kt=True, reuse_v=True),
    "qKt reuse fp16 N32 w8 s2": Config(16, 32, 8, 2, kt=True, reuse_v=True),
}
H128 = {
    "old H64 qKt bf16-widen N32 w8": Config(64, 32, 8, 2, kt=True, widen="bf16"),
    "H64 qKt fp16 N32 w8": Config(64, 32, 8, 2, kt=True),
    "H64 qKt reuse fp16 N32 w8": Config(64, 32, 8, 2, kt=True, reuse_v=True),
    "H64 kqT fp16 N32 w8": Config(64, 32, 8, 2),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, nargs="*", default=[16, 128])
    ap.add_argument("--shapes", default="32x4096,128x16384")
    ap.add_argument("--splits2", action="store_true", help="also time twice the heuristic split count")
    args = ap.parse_args()
    copy = copy_bandwidth_gbps()
    print(f"copy {copy:.0f} GB/s")
    print("| B | ctx | H | variant | splits | µs | %copy | err vs fp32 ref |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        batch, ctx = map(int, shape.split("x"))
        p = make_pools(batch, ctx, 64)
        for heads in args.heads:
            q = torch.randn(batch, heads, HEAD_DIM, device="cuda").to(BF16)
            a = (p.table, p.lens, SM_SCALE, KV_SCALE)
            ref = None
            if batch * ctx <= 2**17:
                ref = reference(q, p.fp8, *a, ctx, False)[0].float()
            else:
                ref = gather_cast(q, p.fp8, *a, ctx, False)[0].float()
            variants = H16 if heads <= 16 else H128
            for name, cfg in variants.items():
                base = pick_num_splits(batch, -(-heads // cfg.block_h), ctx, heads, _num_sms(0), cfg.block_n)
                for splits in sorted({base, 2 * base} if args.splits2 else {base}):
                    try:
                        ms, out = time_graph(lambda: mla_decode_triton(q, p.fp8, *a, config=cfg, num_splits=splits))
                    except Exception as e:  # noqa: BLE001
                        print(f"| {batch} | {ctx} | {heads} | {name} | {splits} | failed: {type(e).__name__} {str(e)[:120]} | | |")
                        break
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    pct = 100 * bytes_moved(batch, ctx, heads, 1) / (ms * 1e-3) / 1e9 / copy
                    print(f"| {batch} | {ctx} | {heads} | {name} | {splits} | {ms * 1e3:.1f} | {pct:.0f}% | {err:.1e} |",
                          flush=True)
            cfg16 = Config(16, 32, 4, 2, kt=True) if heads <= 16 else Config(64, 32, 8, 2)
            ms, _ = time_graph(lambda: mla_decode_triton(q, p.bf16, *a, config=cfg16))
            pct = 100 * bytes_moved(batch, ctx, heads, 2) / (ms * 1e-3) / 1e9 / copy
            print(f"| {batch} | {ctx} | {heads} | bf16 cache (default) | auto | {ms * 1e3:.1f} | {pct:.0f}% | |", flush=True)
        del p
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
