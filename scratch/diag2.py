import sys, torch
sys.path.insert(0, "tests")
from test_mla_decode import make_case, rel_err, BF16, DEVICE
from decodegap.kernels.mla_decode import mla_decode
from decodegap.kernels.mla_decode_triton import mla_decode_triton
torch.manual_seed(0)
for lens in ([3000, 2000], [3008, 2016]):
    base = make_case(2, 64, 64, BF16, lens, 1.0)
    used = torch.zeros(base.kv_cache.shape[0], dtype=torch.bool, device=DEVICE)
    for b, n in enumerate(lens):
        used[base.block_table[b, : -(-n // 64)].long()] = True
    for mode in ("all-nan", "spare-nan", "tail-nan", "none"):
        cache = base.kv_cache.clone()
        if mode in ("spare-nan", "none"):  # tails to zero
            tail = torch.isnan(cache.float()) & used.view(-1, 1, 1)
            cache[tail] = 0
        if mode in ("tail-nan", "none"):
            cache[~used] = 0
        ref = mla_decode(base.q, cache, base.block_table, base.seq_lens, 0.0417, kv_scale=1.0, impl="reference")
        for v in (20, 23):
            out = mla_decode_triton(base.q, cache, base.block_table, base.seq_lens, 0.0417, 1.0, backend="cuda",
                                    wgmma_variant=v, num_splits=1)
            fin = torch.isfinite(out.float())
            print(f"lens={lens} {mode} v={v} nonfinite={(~fin).sum().item()} per-batch={(~fin).view(2,-1).sum(1).tolist()} "
                  f"err={rel_err(torch.nan_to_num(out.float()), ref):.2e}", flush=True)
