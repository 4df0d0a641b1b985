"""Quick A/B of the CUDA stage-1 variants and Triton tile variants on a GPU: FP8 (and BF16 at H<=16) at B=32 ctx
4096 and B=128 ctx 16384 (or --shapes).

    PYTHONPATH=src python3 benchmarks/ab_mla_decode.py [--heads 16 128] [--shapes 32x4096,128x16384]
    PYTHONPATH=src python3 benchmarks/ab_mla_decode.py --warm --only NAME...   # compile only (fill triton's cache)

err is against the float32 reference where B x ctx <= 2^17, else against gather_cast (bf16 math).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from bench_mla_decode import BF16, DEVICE, HEAD_DIM, KV_SCALE, SM_SCALE, bytes_moved, copy_bandwidth_gbps, \
    make_pools, time_graph
from decodegap.kernels.mla_decode import gather_cast, reference
from decodegap.kernels.mla_decode_triton import Config, mla_decode_triton, num_splits_for

CUDA_H16 = {  # the sm_90 CUDA stage 1 (mla_decode_sm90.cu) variants: kwargs of mla_decode_triton
    "cuda N32 st3 3/SM pipelined, V by PRMT (default)": dict(backend="cuda", cuda_variant=0),
    "cuda N32 st4 2/SM, V by movmatrix": dict(backend="cuda", cuda_variant=1),
    "cuda N32 st3 3/SM, V by PRMT": dict(backend="cuda", cuda_variant=2),
}
H16 = {  # the sm_90 CUDA stage 1 (mla_decode_sm90.cu) variants: kwargs of mla_decode_triton
    "cuda N16 st6 3/SM (default)": dict(backend="cuda", cuda_variant=0),
    "cuda N32 st4 2/SM": dict(backend="cuda", cuda_variant=1),
    "cuda pipelined N16 st6 3/SM": dict(backend="cuda", cuda_variant=2),
    "cuda pipelined N32 st4 2/SM": dict(backend="cuda", cuda_variant=3),
    "cuda pipelined N32 st3 3/SM": dict(backend="cuda", cuda_variant=4),
    "cuda pipelined N32 st3 3/SM, V by PRMT": dict(backend="cuda", cuda_variant=5),
    "cuda pipelined N16 st6 3/SM, V by PRMT": dict(backend="cuda", cuda_variant=6),
    "cuda N32 st3 3/SM, V by PRMT": dict(backend="cuda", cuda_variant=7),
}
H16 = {
    "heads-major N32 w4 s2 r168 (triton default)": Config(16, 32, 4, 2, maxnreg=168),
    "heads-major N32 w4 s2": Config(16, 32, 4, 2),
    "heads-major N32 w4 s3 r168": Config(16, 32, 4, 3, maxnreg=168),
    "heads-major N64 w4 s2": Config(16, 64, 4, 2),
    "heads-major N32 w8 s2": Config(16, 32, 8, 2),
}
H128 = {
    "tokens-major H64 N32 w8 s2 (default)": Config(64, 32, 8, 2, heads_major=False),
    "tokens-major H32 N32 w4 s2": Config(32, 32, 4, 2, heads_major=False),
    "heads-major H64 N32 w8 s2": Config(64, 32, 8, 2),
    "heads-major H16 N32 w4 s2 r168": Config(16, 32, 4, 2, maxnreg=168),
}
BF16_H16 = {
    "bf16 heads-major N32 w4 s2 (default)": Config(16, 32, 4, 2),
    "bf16 heads-major N32 w4 s2 r168": Config(16, 32, 4, 2, maxnreg=168),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, nargs="*", default=[16, 128])
    ap.add_argument("--shapes", default="32x4096,128x16384",
                    help="BxCTX[:H+H...] list; heads from --heads where not given")
    ap.add_argument("--pick", help="write the fastest variant per (cache, head class) here as JSON (for "
                    "bench_mla_decode.py --tuned): least total time over the shapes measured, error < 2e-2")
    ap.add_argument("--splits2", action="store_true", help="also time twice the heuristic split count")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    ap.add_argument("--warm", action="store_true", help="compile only (one call per variant and shape), no timing")
    args = ap.parse_args()
    copy = 0.0 if args.warm else copy_bandwidth_gbps()
    if not args.warm:
        print(f"copy {copy:.0f} GB/s")
        print("| B | ctx | H | cache | variant | splits | µs | %copy | err vs fp32 ref |")
        print("|---|---|---|---|---|---|---|---|---|")
    times: dict[tuple[str, int], dict[str, list[float]]] = {}
    cfgs: dict[str, Config] = {}
    for shape in args.shapes.split(","):
        shape, _, hs = shape.partition(":")
        batch, ctx = map(int, shape.split("x"))
        heads_here = [int(h) for h in hs.split("+")] if hs else args.heads
        p = make_pools(batch, ctx, 64) if not args.warm else make_pools(batch, min(ctx, 1024), 64)
        for heads in heads_here:
            q = torch.randn(batch, heads, HEAD_DIM, device=DEVICE).to(BF16)
            a = (p.table, p.lens, SM_SCALE, KV_SCALE)
            refs = {}  # per cache dtype: the bf16 pool is not the fp8 pool widened
            if not args.warm:
                oracle = reference if batch * ctx <= 2**17 else gather_cast
                refs = {d: oracle(q, c, *a, ctx, False)[0].float() for d, c in (("fp8", p.fp8), ("bf16", p.bf16))}
            variants = [("fp8", n, dict(config=c)) for n, c in (H16 if heads <= 16 else H128).items()]
            if heads <= 16:
                variants = ([("fp8", n, kw) for n, kw in CUDA_H16.items()] + variants
                            + [("bf16", n, dict(config=c)) for n, c in BF16_H16.items()])
            for dtype, name, kw in variants:
                if args.only and name not in args.only:
                    continue
                cache = p.fp8 if dtype == "fp8" else p.bf16
                try:
                    base = num_splits_for(q, cache, p.table, **kw)
                except Exception as e:  # noqa: BLE001 (the CUDA path did not build: a result too)
                    print(f"| {batch} | {ctx} | {heads} | {dtype} | {name} | | failed: {type(e).__name__} "
                          f"{str(e)[:120]} | | |", flush=True)
                    continue
                for splits in sorted({base, 2 * base} if args.splits2 else {base}):
                    try:
                        if args.warm:
                            mla_decode_triton(q, cache, *a, num_splits=splits, **kw)
                            continue
                        ms, out = time_graph(lambda q=q, cache=cache, a=a, splits=splits, kw=kw: mla_decode_triton(
                            q, cache, *a, num_splits=splits, **kw))
                    except Exception as e:  # noqa: BLE001
                        print(f"| {batch} | {ctx} | {heads} | {dtype} | {name} | {splits} | failed: {type(e).__name__} "
                              f"{str(e)[:120]} | | |", flush=True)
                        break
                    ref = refs[dtype]
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    if splits == base:
                        t = times.setdefault((dtype, 16 if heads <= 16 else 128), {}).setdefault(name, [])
                        t.append(ms if err < 2e-2 else float("inf"))
                        if "config" in kw:
                            cfgs[name] = kw["config"]
                    pct = 100 * bytes_moved(batch, ctx, heads, 1 if dtype == "fp8" else 2) / (ms * 1e-3) / 1e9 / copy
                    print(f"| {batch} | {ctx} | {heads} | {dtype} | {name} | {splits} | {ms * 1e3:.1f} | {pct:.0f}% | "
                          f"{err:.1e} |", flush=True)
        del p
        torch.cuda.empty_cache()
    if args.pick and not args.warm:
        picks = {}
        for (dtype, hclass), by_name in times.items():
            by_name = {n: v for n, v in by_name.items() if n in cfgs}  # Triton configs only
            if not by_name:
                continue
            most = max(len(v) for v in by_name.values())
            name = min((n for n, v in by_name.items() if len(v) == most), key=lambda n: sum(by_name[n]))
            picks[f"{dtype},{hclass}"] = {"name": name, "config": dataclasses.asdict(cfgs[name]),
                                          "ms": by_name[name]}
            print(f"pick {dtype} H{hclass}: {name} ({', '.join(f'{1e3 * x:.1f}' for x in by_name[name])} µs)")
        with open(args.pick, "w") as fh:
            json.dump(picks, fh, indent=1)


if __name__ == "__main__":
    main()
