import ctypes, sys, torch
sys.path.insert(0, "tests")
from test_mla_decode import make_case, rel_err, BF16, DEVICE
from decodegap.kernels import mla_decode_sm90 as sm90
from decodegap.kernels.mla_decode import mla_decode
from decodegap.kernels.mla_decode_triton import mla_decode_triton
torch.manual_seed(0)
lens = [3000, 2000]
base = make_case(2, 64, 64, BF16, lens, 1.0)
used = torch.zeros(base.kv_cache.shape[0], dtype=torch.bool, device=DEVICE)
for b, n in enumerate(lens):
    used[base.block_table[b, : -(-n // 64)].long()] = True
base.kv_cache[~used] = 0
nanmask = torch.isnan(base.kv_cache.float())
for flag in ("", "-DDG_ZERO_PRE_FENCE", "-DDG_ZERO_ALL"):
    lib = sm90.bind_wgmma(ctypes.CDLL(str(sm90.build("sm_90a", source=sm90._WGMMA_SOURCE, gencode=sm90._WGMMA_GENCODE + ((flag,) if flag else ())))))
    sm90._wgmma_library = lambda device_index, lib=lib: lib
    sm90.wgmma_info.cache_clear()
    for mode, dims in (("value-dims", slice(0, 512)), ("rope-dims", slice(512, 576))):
        cache = torch.nan_to_num(base.kv_cache.float(), nan=0.0)
        m = torch.zeros_like(nanmask)
        m[..., dims] = nanmask[..., dims]
        cache[m] = float("nan")
        cache = cache.to(BF16)
        ref = mla_decode(base.q, torch.nan_to_num(cache.float()).to(BF16), base.block_table, base.seq_lens, 0.0417, kv_scale=1.0, impl="reference")
        for v in (20, 23, 24):
            out = mla_decode_triton(base.q, cache, base.block_table, base.seq_lens, 0.0417, 1.0, backend="cuda",
                                    wgmma_variant=v, num_splits=1)
            fin = torch.isfinite(out.float())
            print(f"{flag or 'default'} {mode} v={v} nonfinite={(~fin).sum().item()} err={rel_err(torch.nan_to_num(out.float()), ref):.2e}", flush=True)
