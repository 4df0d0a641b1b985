"""Throughput of the wgmma shapes of the MLA decode kernel in isolation (mla_wgmma_rate.cu) on one Hopper GPU:
for each mode and 1, 2 or 3 warpgroups per SM, the FLOP per clock per SM (the H200's dense bf16 peak is 4,096:
989 TFLOP/s at 1.83 GHz on 132 SMs) and the clocks one warpgroup's async group takes.

    PYTHONPATH=src python3 benchmarks/mla_wgmma_rate.py

Prints a markdown table. Tells whether the 32-token score tile (m64n32k16, 36 k-steps) is what keeps the H=128
kernel from the tensor peak, before a 64-token tile is built.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

import torch

from decodegap.kernels import mla_decode_sm90

MODES = {  # mode: (what, FLOP per warpgroup per iteration)
    0: ("scores, 32-token tile, 36 x m64n32k16 SS", 2 * 64 * 32 * 576),
    1: ("scores, 32-token tile, 36 x m64n32k16 RS", 2 * 64 * 32 * 576),
    2: ("scores, 64-token tile, 36 x m64n64k16 SS", 2 * 64 * 64 * 576),
    3: ("scores, 64-token tile, 36 x m64n64k16 RS", 2 * 64 * 64 * 576),
    4: ("P.V of a 32-token pair, 2 RS + 2 SS m64n256k16", 2 * 64 * 256 * 64),
    5: ("mode 0 then mode 4 (a seesaw pair's tensor work)", 2 * 64 * 32 * 576 + 2 * 64 * 256 * 64),
    6: ("mode 2 then 4 RS + 4 SS m64n256k16 (64-token pair)", 2 * 64 * 64 * 576 + 2 * 64 * 256 * 128),
}
PEAK = 4096


def main() -> int:
    if not torch.cuda.is_available():
        print("mla_wgmma_rate: needs a CUDA GPU", file=sys.stderr)
        return 2
    src = Path(__file__).with_name("mla_wgmma_rate.cu")
    os.environ["DECODEGAP_CACHE_DIR"] = tempfile.mkdtemp()
    lib = ctypes.CDLL(str(mla_decode_sm90.build("sm_90a", source=src, gencode=mla_decode_sm90._WGMMA_GENCODE)))
    iters = lib.dg_wgmma_rate_iters()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cycles = torch.zeros(sms, dtype=torch.int64, device="cuda")
    sink = torch.zeros(384, device="cuda")
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, {iters} iterations per warpgroup, one CTA per SM")
    print("| mode | what | warpgroups | clocks per group (per warpgroup) | FLOP/clk/SM | % of 4096 |")
    print("|---|---|---|---|---|---|")
    for mode, (what, flop) in MODES.items():
        for wg in (1, 2, 3) if mode < 4 else (1, 2):
            err = 0
            for _ in range(2):  # the first run warms the clocks
                err = lib.dg_wgmma_rate(mode, sms, wg, ctypes.c_void_p(cycles.data_ptr()),
                                        ctypes.c_void_p(sink.data_ptr()))
            if err:
                print(f"| {mode} | {what} | {wg} | CUDA error {err} | | |")
                continue
            clk = cycles.double().median().item()
            rate = flop * wg * iters / clk
            print(f"| {mode} | {what} | {wg} | {clk / iters:.0f} | {rate:.0f} | {100 * rate / PEAK:.0f}% |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
