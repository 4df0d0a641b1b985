"""Check the wgmma kernel's two products in isolation (mla_wgmma_probe.cu) against torch on one H200.

    PYTHONPATH=src python3 benchmarks/mla_wgmma_probe.py

Prints the relative error of S = Q K^T (K-major descriptors, 128-byte swizzle) and of O = P V (P from registers,
V N-major): near 1e-6 when the layouts are right, near 1 when a descriptor or fragment layout is wrong.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

import torch

from decodegap.kernels import mla_decode_sm90


def main() -> int:
    if not torch.cuda.is_available():
        print("mla_wgmma_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    src = Path(__file__).with_name("mla_wgmma_probe.cu")
    os.environ["DECODEGAP_CACHE_DIR"] = tempfile.mkdtemp()  # the probe includes the kernel: never a stale build
    lib = ctypes.CDLL(str(mla_decode_sm90.build("sm_90a", source=src, gencode=mla_decode_sm90._WGMMA_GENCODE)))
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    q = torch.randn(64, 576, device="cuda").bfloat16()
    k = torch.randn(32, 576, device="cuda").bfloat16()
    p = torch.rand(64, 32, device="cuda").bfloat16()
    s = torch.full((64, 32), float("nan"), device="cuda")
    o = torch.full((64, 256), float("nan"), device="cuda")
    err = lib.dg_wgmma_probe(ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()),
                             ctypes.c_void_p(p.data_ptr()), ctypes.c_void_p(s.data_ptr()),
                             ctypes.c_void_p(o.data_ptr()))
    if err:
        print(f"probe failed: CUDA error {err}")
        return 1
    s_ref = q.double() @ k.double().T
    o_ref = p.double() @ k.double()[:, :256]
    e_s = ((s.double() - s_ref).norm() / s_ref.norm()).item()
    e_o = ((o.double() - o_ref).norm() / o_ref.norm()).item()
    print(f"wgmma probe: S = Q K^T rel. error {e_s:.2e}, O = P V rel. error {e_o:.2e}")
    for name, got, want in (("S", s, s_ref), ("O", o, o_ref)):
        if not ((got.double() - want).norm() / want.norm()).item() < 1e-3:
            print(f"  {name}[0, :6] {[round(x, 3) for x in got[0, :6].tolist()]} want "
                  f"{[round(x, 3) for x in want[0, :6].tolist()]}; {name}[9, :6] "
                  f"{[round(x, 3) for x in got[9, :6].tolist()]} want {[round(x, 3) for x in want[9, :6].tolist()]}")
    return 0 if e_s < 1e-3 and e_o < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
