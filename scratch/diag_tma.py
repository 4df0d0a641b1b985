import sys, torch
sys.path.insert(0, "tests")
from test_mla_decode import make_case, rel_err, BF16, DEVICE
from decodegap.kernels.mla_decode import mla_decode
from decodegap.kernels.mla_decode_triton import mla_decode_triton
torch.manual_seed(0)
for ramped in (True, False):
    case = make_case(2, 64, 64, BF16, [3000, 2000], 1.0)
    if ramped:
        ramp = torch.linspace(0.2, 3.0, case.kv_cache.shape[0] * 64, device=DEVICE).view(-1, 64, 1)
        case.kv_cache = (case.kv_cache.float() * ramp).clamp(-448, 448).to(BF16)
    sm = 0.3 if ramped else 0.0417
    ref = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, sm, kv_scale=1.0, impl="reference")
    for v in (20, 23, 47, 24):
        for splits in (None, 1, 2, 8, 43):
            out = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, sm, 1.0, backend="cuda",
                                    wgmma_variant=v, num_splits=splits)
            fin = torch.isfinite(out.float())
            bad = (~fin).nonzero()
            print(f"ramped={ramped} v={v} splits={splits} finite={fin.all().item()} nbad={bad.shape[0]} "
                  f"batches={sorted(set(bad[:,0].tolist()))[:4]} heads={sorted(set(bad[:,1].tolist()))[:8]} "
                  f"err={rel_err(torch.nan_to_num(out.float()), ref):.2e}", flush=True)
