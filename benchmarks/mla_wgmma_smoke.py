"""A few calls of every wgmma MLA decode kernel variant against the float32 reference, on fresh random inputs,
before the test suite (run under a short timeout: a pipeline bug shows as a hang here, not in every later step);
with --ab, then the FP8 and the BF16 variants timed at 64 and 128 heads (CUDA graph replay), the fastest FP8 one
written to --pick, the fastest BF16 one to --pick-bf16 (the first variant of each is timed twice: the spread).

    PYTHONPATH=src python3 benchmarks/mla_wgmma_smoke.py [--ab --pick FILE --pick-bf16 FILE] [--variants 0,8,...]

(--variants: only these in the A/B; the smoke check runs every variant.)

exit 0: every cache type has a variant within 2e-2; 1: none has.
"""

from __future__ import annotations

import sys

import torch

from decodegap.kernels.mla_decode import HEAD_DIM, reference
from decodegap.kernels.mla_decode_sm90 import WGMMA_VARIANTS
from decodegap.kernels.mla_decode_triton import cuda_path, mla_decode_triton


def ab(pick: str | None, pick_bf16: str | None, bad: set[int], only: set[int] | None = None) -> None:
    from bench_mla_decode import BF16, DEVICE, KV_SCALE, SM_SCALE, make_pools, time_graph

    for kv_dtype, name, out_file in ((torch.float8_e4m3fn, "fp8", pick), (torch.bfloat16, "bf16", pick_bf16)):
        variants = [v for v, d in WGMMA_VARIANTS.items() if d == kv_dtype and v not in bad
                    and (only is None or v in only)]
        total = dict.fromkeys(variants, 0.0)
        # (B=1 and 32 heads are timed for the record, left out of the pick's sum)
        for batch, ctx, heads in ((32, 4096, 128), (32, 4096, 64), (128, 16384, 128), (1, 4096, 128), (32, 4096, 32)):
            p = make_pools(batch, ctx, 64)
            cache = p.fp8 if name == "fp8" else p.bf16
            q = torch.randn(batch, heads, HEAD_DIM, device=DEVICE).to(BF16)
            for i, v in enumerate(variants + variants[:1]):  # the first variant twice: the run-to-run spread
                ms, _ = time_graph(lambda q=q, p=p, v=v, c=cache: mla_decode_triton(q, c, p.table, p.lens, SM_SCALE,
                                                                                     KV_SCALE, wgmma_variant=v))
                if i < len(variants) and batch > 1 and heads > 32:  # (the repeat only shows the spread)
                    total[v] += ms / (batch * ctx)
                print(f"ab: B={batch} ctx={ctx} H={heads} {name} wgmma variant {v}: {ms * 1e3:.1f} us", flush=True)
            p = q = cache = None  # free the pools before the next shape
            torch.cuda.empty_cache()
        best = min(total, key=total.get)
        print(f"ab: fastest {name} variant {best}", flush=True)
        if out_file:
            with open(out_file, "w") as fh:
                fh.write(f"{best}\n")


def main() -> int:
    if not torch.cuda.is_available():
        return 2
    bad: set[int] = set()
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
            print(f"checking v{variant} H={heads} {str(kv_dtype).split('.')[-1]} ...", flush=True)  # a hang shows here
            out, lse = mla_decode_triton(q, cache, table, lens, 1 / 16, 0.8, return_lse=True, num_splits=splits,
                                         backend="cuda", wgmma_variant=variant)
            torch.cuda.synchronize()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            lse_err = (lse - ref_lse).abs().max().item()
            good = err < 2e-2 and lse_err < 2e-2 and bool(torch.isfinite(out.float()).all())
            if not good:
                bad.add(variant)
            print(f"{cuda_path(q, cache)} v{variant} H={heads} {str(kv_dtype).split('.')[-1]} B={batch} ctx={ctx} "
                  f"splits={splits}: rel. error {err:.2e}, max |lse error| {lse_err:.2e} {'ok' if good else 'WRONG'}",
                  flush=True)
    # A wrong variant is left out of the A/B (and fails the tests); exit 1 only when a cache type has none left.
    ok = all(any(v not in bad for v, d in WGMMA_VARIANTS.items() if d == t) for t in (fp8, bf16))
    if bad:
        print(f"WRONG variants, left out of the A/B: {sorted(bad)}", flush=True)
    if ok and "--ab" in sys.argv:
        only = ({int(v) for v in sys.argv[sys.argv.index("--variants") + 1].split(",")}
                if "--variants" in sys.argv else None)
        ab(sys.argv[sys.argv.index("--pick") + 1] if "--pick" in sys.argv else None,
           sys.argv[sys.argv.index("--pick-bf16") + 1] if "--pick-bf16" in sys.argv else None, bad, only)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
