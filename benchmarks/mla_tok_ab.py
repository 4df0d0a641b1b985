"""The <= 16-head FP8 path on the H200: a correctness smoke of the tokens-major wgmma kernel (variants 3 and 4, with
and without its cluster combine), then an A/B against the mma.sync kernel (variant 0), its cp.async loads (variant
4), the Triton merge kernel instead of its cluster combine, and other split counts (CUDA graph replay; do_bench
medians with the L2 flushed by zeroing, and medians with the L2 flushed by reading: no dirty lines written back
during the call; % of copy bandwidth); `[default]` marks what mla_decode runs at that size.

    PYTHONPATH=src python3 benchmarks/mla_tok_ab.py [--smoke-only] [--shapes 32x4096:16,...]

Exit 1 when a smoke case is wrong (then no timing): run it under a short timeout before the test suite.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from decodegap.kernels import mla_decode_sm90 as sm90
from decodegap.kernels.mla_decode import HEAD_DIM, reference
from decodegap.kernels.mla_decode_triton import mla_decode_triton, num_splits_for, pick_num_splits

SHAPES = "1x4096:16,8x4096:16,32x4096:16+8,32x16384:16,128x4096:16,128x16384:16"


def smoke() -> bool:
    ok = True
    for cluster in (sm90.TOK_CLUSTER_MAX_SPLITS, 0):
        old = sm90.TOK_CLUSTER_MAX_SPLITS
        sm90.TOK_CLUSTER_MAX_SPLITS = cluster
        try:
            ok &= _smoke(cluster)
        finally:
            sm90.TOK_CLUSTER_MAX_SPLITS = old
    return ok


def _smoke(cluster: int) -> bool:
    ok = True
    fp8 = torch.float8_e4m3fn
    for variant, heads, batch, ctx, page, splits in [
            (v, *c) for v in sm90.TOK_VARIANTS
            for c in [(16, 4, 1000, 64, None), (8, 3, 333, 16, 3), (1, 2, 64, 1, 1), (12, 2, 2100, 64, 20),
                      (16, 1, 4096, 64, None), (16, 3, 1000, 32, 2), (16, 2, 300, 128, 1)]]:
        pages = batch * (-(-ctx // page))
        cache = (torch.randn(pages, page, HEAD_DIM, device="cuda") * 0.6).to(fp8)
        table = torch.randperm(pages, device="cuda").view(batch, -1).int()
        lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        lens[0] = max(1, ctx - 37)
        q = torch.randn(batch, heads, HEAD_DIM, device="cuda").bfloat16()
        ref, ref_lse = reference(q, cache, table, lens, 1 / 16, 0.8, ctx, True)
        out, lse = mla_decode_triton(q, cache, table, lens, 1 / 16, 0.8, return_lse=True, num_splits=splits,
                                     backend="cuda", cuda_variant=variant)
        torch.cuda.synchronize()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        lse_err = (lse - ref_lse).abs().max().item()
        good = err < 2e-2 and lse_err < 2e-2 and bool(torch.isfinite(out.float()).all())
        ok &= good
        used = splits or num_splits_for(q, cache, table, cuda_variant=variant)
        comb = "cluster" if sm90.tok_cluster_combine(0, variant, used, batch) else "merge"
        print(f"smoke tok v{variant} ({comb}) H={heads} B={batch} ctx={ctx} page={page} splits={splits}: rel. error "
              f"{err:.2e}, max |lse error| {lse_err:.2e} {'ok' if good else 'WRONG'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke-only", action="store_true")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--small", action="store_true",
                    help="only the mma.sync kernel, the tokens-major one at its split count and at the count for "
                    "slices of one tile (small problems)")
    ap.add_argument("--h128-splits", action="store_true",
                    help="also the 128-head wgmma kernel (FP8, BF16) at B=32 ctx 4096 and B=128 ctx 16384 over split "
                    "counts around its heuristic's")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        return 2
    info = sm90.kernel_info(0, sm90.TOK_VARIANT)
    print(f"tok kernel: {info.registers} registers, {info.ctas_per_sm} CTAs/SM, BN {info.block_n}, combines up to "
          f"{info.max_inline_splits} splits itself; clusters that fit at once: "
          + ", ".join(f"{s} CTAs: {sm90.tok_max_clusters(0, sm90.TOK_VARIANT, s)}" for s in (1, 2, 4, 8)), flush=True)
    if not smoke():
        return 1
    if args.smoke_only:
        return 0
    from bench_mla_decode import BF16, DEVICE, KV_SCALE, SM_SCALE, bytes_moved, copy_bandwidth_gbps, make_pools, \
        time_graph

    copy = copy_bandwidth_gbps()
    print(f"copy {copy:.0f} GB/s")
    print("| B | ctx | H | variant | splits | µs | % copy | µs, L2 flushed by reads | % copy | err vs fp32 ref "
          "(first <= 4 seqs) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for part in args.shapes.split(","):
        shape, _, hs = part.partition(":")
        batch, ctx = map(int, shape.split("x"))
        p = make_pools(batch, ctx, 64)
        for heads in [int(h) for h in hs.split("+")]:
            q = torch.randn(batch, heads, HEAD_DIM, device=DEVICE).to(BF16)
            a = (p.table, p.lens, SM_SCALE, KV_SCALE)
            n = min(batch, 4)
            ref = reference(q[:n], p.fp8, p.table[:n], p.lens[:n], SM_SCALE, KV_SCALE, ctx, False)[0].float()
            base = num_splits_for(q, p.fp8, p.table, cuda_variant=sm90.TOK_VARIANT)
            default = sm90.default_variant(0, batch * p.table.shape[1] * 64)
            # (name, variant, splits, cluster max: None = as configured, 0 = the merge kernel, how: "" as
            # configured, "plain" = the merge launched without PDL, "padded" = the table one column wider, so the
            # tokens-major kernel's first page ids guessed for the table's span miss and are loaded again)
            cands = [("mma.sync v0", 0, None, None, ""), ("mma.sync v0, merge without PDL", 0, None, None, "plain"),
                     ("tok v3 (TMA)", 3, None, None, ""), ("tok v3 (TMA), merge kernel", 3, None, 0, ""),
                     ("tok v3 (TMA), merge kernel without PDL", 3, None, 0, "plain"),
                     ("tok v3 (TMA), table + 1 column", 3, None, None, "padded"),
                     ("tok v4 (cp.async)", 4, None, None, "")]
            cands = [(n + (" [default]" if v == default and m is None and not h else ""), v, s, m, h)
                     for n, v, s, m, h in cands]
            for s in sorted({max(1, base // 2), 2 * base} - {base}):
                cands.append((f"tok v3, {s} splits", 3, s, None, ""))
            one = pick_num_splits(batch, 1, p.table.shape[1] * 64, heads, torch.cuda.get_device_properties(0)
                                  .multi_processor_count, 64, info.ctas_per_sm, min_tiles=1)
            if args.small:
                cands = [cands[0], cands[2]] + ([(f"tok v3, slices of one tile: {one} splits", 3, one, None, "")]
                                                if one != base else [])
            padded = torch.cat([p.table, p.table[:, :1]], dim=1)
            for name, variant, splits, cluster_max, how in cands:
                old = sm90.TOK_CLUSTER_MAX_SPLITS
                if cluster_max is not None:
                    sm90.TOK_CLUSTER_MAX_SPLITS = cluster_max
                if how == "plain":
                    os.environ["DECODEGAP_MLA_PDL"] = "0"
                try:
                    used = splits or num_splits_for(q, p.fp8, p.table, cuda_variant=variant)
                    if variant in sm90.TOK_VARIANTS and sm90.tok_cluster_combine(0, variant, used, batch):
                        name += " (cluster combine)"
                    tab = padded if how == "padded" else p.table

                    def call(q=q, p=p, a=(tab, *a[1:]), s=used, v=variant):
                        return mla_decode_triton(q, p.fp8, *a, num_splits=s, backend="cuda", cuda_variant=v)

                    ms, out = time_graph(call)
                    ms_clean, _ = time_graph(call, read_flushed=True)
                finally:
                    sm90.TOK_CLUSTER_MAX_SPLITS = old
                    os.environ.pop("DECODEGAP_MLA_PDL", None)
                err = ((out[:n].float() - ref).norm() / ref.norm()).item()
                gb = bytes_moved(batch, ctx, heads, 1) / 1e9
                pct, pct_clean = (100 * gb / (t * 1e-3) / copy for t in (ms, ms_clean))
                print(f"| {batch} | {ctx} | {heads} | {name} | {used} | {ms * 1e3:.1f} | {pct:.0f}% | "
                      f"{ms_clean * 1e3:.1f} | {pct_clean:.0f}% | {err:.1e} |", flush=True)
            del q
        del p
        torch.cuda.empty_cache()
    if args.h128_splits:
        for batch, ctx in ((32, 4096), (128, 16384)):
            p = make_pools(batch, ctx, 64)
            q = torch.randn(batch, 128, HEAD_DIM, device=DEVICE).to(BF16)
            a = (p.table, p.lens, SM_SCALE, KV_SCALE)
            for kv_name, cache in (("fp8", p.fp8), ("bf16", p.bf16)):
                base = num_splits_for(q, cache, p.table)
                for splits in sorted({base, base + 1, 2 * base, 3 * base, 4 * base}):
                    ms, _ = time_graph(lambda q=q, c=cache, a=a, s=splits: mla_decode_triton(q, c, *a, num_splits=s))
                    pct = 100 * bytes_moved(batch, ctx, 128, 1 if kv_name == "fp8" else 2) / (ms * 1e-3) / 1e9 / copy
                    tag = " [default]" if splits == base else ""
                    print(f"| {batch} | {ctx} | 128 | wgmma {kv_name}{tag} | {splits} | {ms * 1e3:.1f} | {pct:.0f}% "
                          "| |", flush=True)
            del p, q
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
