import ctypes, sys, torch
sys.path.insert(0, "tests")
from test_mla_decode import make_case, BF16, DEVICE
from decodegap.kernels import mla_decode_sm90 as sm90
from decodegap.kernels.mla_decode_triton import mla_decode_triton
torch.manual_seed(0)
lens = [3000, 2000]
base = make_case(2, 64, 64, BF16, lens, 1.0)
lib = sm90.bind_wgmma(ctypes.CDLL(str(sm90.build("sm_90a", source=sm90._WGMMA_SOURCE, gencode=sm90._WGMMA_GENCODE + ("-DDG_DEBUG_TAIL", "-DDG_TMA_CROSSING_CPASYNC=0")))))
sm90._wgmma_library = lambda device_index: lib
sm90.wgmma_info.cache_clear()
for v in (23, 24):
    out = mla_decode_triton(base.q, base.kv_cache, base.block_table, base.seq_lens, 0.0417, 1.0, backend="cuda",
                            wgmma_variant=v, num_splits=1)
    torch.cuda.synchronize()
    print(f"v={v} nonfinite={(~torch.isfinite(out.float())).sum().item()}", flush=True)
