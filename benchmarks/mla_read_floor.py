"""What any kernel takes just to read the live KV of an MLA decode call at a given size: a Triton kernel that streams
each sequence's pages (576 bytes a token, page size 64, the pages in shuffled order as in bench_mla_decode.py) and
reduces them to one word per program, timed as the decode kernels are (one CUDA graph replay per call, the L2
zero-flushed as do_bench does, and flushed by reads). The best over several split counts is the read floor at that
size: launch, ramp-up and tail included. Set against the issue's goal of 75% of copy bandwidth, it says what the size
itself leaves for the attention kernel (issue 22: the H <= 16 FP8 goal at B=32, ctx 4096).

    cd benchmarks && python3 mla_read_floor.py [--shapes 32x4096,128x4096,32x16384,128x16384]
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

from bench_mla_decode import copy_bandwidth_gbps, make_pools, time_graph


@triton.jit
def _read_pages(kv_ptr, table_ptr, out_ptr, ctx, stride_tb, SPLITS: tl.constexpr, PAGE: tl.constexpr):
    """Program (split, b): xor of every 32-bit word of its slice's tokens (576 bytes = 144 words each)."""
    split, b = tl.program_id(0), tl.program_id(1)
    per = tl.cdiv(tl.cdiv(ctx, SPLITS), PAGE) * PAGE
    start = split * per
    end = tl.minimum(start + per, ctx)
    rows = tl.arange(0, PAGE)
    lat = tl.arange(0, 128)
    rope = tl.arange(0, 16)
    acc = tl.zeros([PAGE, 128], dtype=tl.int32)
    acc_r = tl.zeros([PAGE, 16], dtype=tl.int32)
    for tok0 in range(start, end, PAGE):
        page = tl.load(table_ptr + b * stride_tb + tok0 // PAGE).to(tl.int64)
        base = kv_ptr + page * (PAGE * 144) + rows[:, None] * 144
        live = (tok0 + rows < end)[:, None]
        acc ^= tl.load(base + lat[None, :], mask=live, other=0)
        acc_r ^= tl.load(base + 128 + rope[None, :], mask=live, other=0)
    word = tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor) ^ tl.reduce(tl.reduce(acc_r, 1, _xor), 0, _xor)
    tl.store(out_ptr + b * SPLITS + split, word)


@triton.jit
def _xor(a, b):
    return a ^ b


def read_floor(batch: int, ctx: int, splits: int, read_flushed: bool) -> float:
    p = make_pools(batch, ctx, 64)
    words = p.fp8.view(torch.int32)  # [pages, 64, 144]
    out = torch.empty(batch * splits, dtype=torch.int32, device=words.device)

    def run():
        _read_pages[(splits, batch)](words, p.table, out, ctx, p.table.stride(0), SPLITS=splits, PAGE=64,
                                     num_warps=4)
        return out

    ms, _ = time_graph(run, read_flushed=read_flushed)
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="32x4096,128x4096,32x16384,128x16384", help="BxCTX,...")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("mla_read_floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    copy = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: device copy {copy:.0f} GB/s (read + write)")
    print("| B | ctx | live KV (MB) | read floor, zero-flushed L2: µs (% copy), splits "
          "| flushed by reads: µs (% copy), splits | 75% of copy: µs |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        batch, ctx = (int(x) for x in shape.split("x"))
        mb = batch * ctx * 576 / 1e6
        cells = []
        for read_flushed in (False, True):
            best = min((read_floor(batch, ctx, s, read_flushed), s) for s in (1, 2, 4, 8, 16, 32))
            us = best[0] * 1e3
            cells.append(f"{us:.1f} ({mb * 1e6 / (us * 1e-6) / 1e9 / copy:.0%}), {best[1]}")
            torch.cuda.empty_cache()
        print(f"| {batch} | {ctx} | {mb:.1f} | {cells[0]} | {cells[1]} | {mb * 1e6 / (0.75 * copy * 1e9) * 1e6:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
