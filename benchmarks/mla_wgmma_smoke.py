"""A few calls of every wgmma MLA decode kernel variant against the float32 reference, on fresh random inputs,
before the test suite (run under a short timeout: a pipeline bug shows as a hang here, not in every later step);
with --ab, then the FP8 variants timed at 64 and 128 heads (CUDA graph replay), the fastest written to --pick.

    PYTHONPATH=src python3 benchmarks/mla_wgmma_smoke.py [--ab --pick FILE]  # exit 0: all within 2e-2, 1: wrong
"""

from __future__ import annotations

import sys

import torch

from decodegap.kernels.mla_decode import HEAD_DIM, reference
from decodegap.kernels.mla_decode_sm90 import WGMMA_VARIANTS
from decodegap.kernels.mla_decode_triton import cuda_path, mla_decode_triton


def ab(pick: str | None) -> None:
    from bench_mla_decode import BF16, DEVICE, KV_SCALE, SM_SCALE, make_pools, time_graph

    fp8_variants = [v for v, d in WGMMA_VARIANTS.items() if d == torch.float8_e4m3fn]
    total = dict.fromkeys(fp8_variants, 0.0)
    for batch, ctx, heads in ((32, 4096, 128), (32, 4096, 64), (128, 16384, 128)):
        p = make_pools(batch, ctx, 64)
        q = torch.randn(batch, heads, HEAD_DIM, device=DEVICE).to(BF16)
        for v in fp8_variants:
            ms, _ = time_graph(lambda q=q, p=p, v=v: mla_decode_triton(q, p.fp8, p.table, p.lens, SM_SCALE,
                                                                       KV_SCALE, wgmma_variant=v))
            total[v] += ms / (batch * ctx)
            print(f"ab: B={batch} ctx={ctx} H={heads} fp8 wgmma variant {v}: {ms * 1e3:.1f} us", flush=True)
        p = q = None  # free the pools before the next shape
        torch.cuda.empty_cache()
    best = min(total, key=total.get)
    print(f"ab: fastest FP8 variant {best}", flush=True)
    if pick:
        with open(pick, "w") as fh:
            fh.write(f"{best}\n")


def main() -> int:
    if not torch.cuda.is_available():
        return 2
    ok = True
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    for heads, kv_dtype, batch, ctx, splits in [(128, fp8, 4, 1000, 1), (128, bf16, 4, 1000, 2), (64, fp8, 3, 333, 3),
                                                (32, bf16, 2, 64, 1)]:
        page = 64
        pages = batch * (-(-ctx // page))
        cache = (torch.randn(pages, page, HEAD_DIM, device="cuda") * 0.6).to(kv_dtype)
        table = torch.randperm(pages, device="cuda").view(batch, -1).int()
        lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        lens[0] = max(1, ctx - 37)
        q = torch.randn(batch, heads, HEAD_DIM, device="cuda").bfloat16()
        ref, ref_lse = reference(q, cache, table, lens, 1 / 16, 0.8, ctx, True)
        for variant in [v for v, d in WGMMA_VARIANTS.items() if d == kv_dtype]:
            out, lse = mla_decode_triton(q, cache, table, lens, 1 / 16, 0.8, return_lse=True, num_splits=splits,
                                         backend="cuda", wgmma_variant=variant)
            torch.cuda.synchronize()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            lse_err = (lse - ref_lse).abs().max().item()
            good = err < 2e-2 and lse_err < 2e-2 and bool(torch.isfinite(out.float()).all())
            ok &= good
            print(f"{cuda_path(q, cache)} v{variant} H={heads} {str(kv_dtype).split('.')[-1]} B={batch} ctx={ctx} "
                  f"splits={splits}: rel. error {err:.2e}, max |lse error| {lse_err:.2e} {'ok' if good else 'WRONG'}",
                  flush=True)
    if ok and "--ab" in sys.argv:
        ab(sys.argv[sys.argv.index("--pick") + 1] if "--pick" in sys.argv else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
