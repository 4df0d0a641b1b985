"""Compile the MLA decode kernels for sm_90 without a GPU and summarize what each config became: registers,
spills, shared memory, the instructions that matter (e4m3 conversions, mma/wgmma, shared-memory loads), and the
SASS instructions in the KV loop per warp (one [BLOCK_N, 576] tile) and per token.

    PYTHONPATH=src python3 benchmarks/inspect_sm90.py [--dump DIR] [--only NAME ...]

Runs on a CPU machine with triton's bundled ptxas/cuobjdump; on a GPU machine it does the same. The CUDA stage-1
variants (mla_decode_sm90.cu) are built with nvcc -cubin where nvcc exists (columns: cvt = F2FP, mma = HMMA in
SASS, the ldmatrix column counts movmatrix; loop = the longest loop, which for the pipelined kernel includes the
rare rescale block).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402

from decodegap.kernels.mla_decode_triton import Config, compile_for_gpu  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16

CONFIGS = {  # name -> (config, cache dtype, FP8 widened before staging)
    "heads-major N32 w4 s2 r168 (default)": (Config(16, 32, 4, 2, maxnreg=168), FP8, True),
    "heads-major N32 w4 s2": (Config(16, 32, 4, 2), FP8, True),
    "heads-major N32 w4 s2, plain cast": (Config(16, 32, 4, 2), FP8, False),
    "heads-major N64 w4 s2": (Config(16, 64, 4, 2), FP8, True),
    "heads-major N32 w8 s2": (Config(16, 32, 8, 2), FP8, True),
    "tokens-major H64 N32 w8 s2 (default H>16)": (Config(64, 32, 8, 2, heads_major=False), FP8, False),
    "bf16 heads-major N32 w4 s2 (default)": (Config(16, 32, 4, 2), BF16, False),
    "bf16 heads-major N32 w4 s2 r168": (Config(16, 32, 4, 2, maxnreg=168), BF16, False),
    "bf16 tokens-major H64 N32 w8 s2": (Config(64, 32, 8, 2, heads_major=False), BF16, False),
}


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest backward branch's span: the KV loop."""
    instrs = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;", sass)]
    best = (0, -1)
    for addr, ins in instrs:
        m = re.search(r"BRA (0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > best[1] - best[0]:
            best = (int(m.group(1), 16), addr)
    return [ins for addr, ins in instrs if best[0] <= addr <= best[1]]


def summarize(name: str, cfg: Config, k, dump: str | None) -> str:
    ptx = k.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    if dump:
        os.makedirs(dump, exist_ok=True)
        base = os.path.join(dump, re.sub(r"\W+", "_", name))
        for ext, text in (("ptx", ptx), ("sass", sass), ("ttgir", k.asm["ttgir"])):
            with open(f"{base}.{ext}", "w") as fh:
                fh.write(text)

    def n(pat: str, text: str) -> int:
        return len(re.findall(pat, text))

    body = loop_body(sass)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in body)
    top = ", ".join(f"{op} {c}" for op, c in ops.most_common(6))
    pats = [r"cvt\.rn\.f16x2\.e4m3x2", r"mma\.sync", r"wgmma\.mma_async", r"ldmatrix", r"ld\.shared\.[bu]8"]
    cols = [str(n(p, ptx)) for p in pats] + [str(n(r"\b(?:LDL|STL)\b", sass))]
    per_token = len(body) * cfg.num_warps / cfg.block_n
    head = [name, regs.group(1) if regs else "?", stack.group(1) if stack else "?", f"{k.metadata.shared // 1024} KiB"]
    return "| " + " | ".join(head + cols + [str(len(body)), f"{per_token:.0f}", top]) + " |"


def cuda_rows() -> list[str]:
    """The same columns for the CUDA stage-1 variants (mla_decode_sm90.cu), built with nvcc -cubin for sm_90."""
    from decodegap.kernels import mla_decode_sm90

    nvcc = mla_decode_sm90._nvcc()
    if nvcc is None:
        return ["| cuda variants | nvcc not found |"]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90", "-cubin", "-o", cubin,
                        str(mla_decode_sm90._SOURCE)], check=True, capture_output=True)
        sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
        res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
    usage = dict(re.findall(r"Function (\S+):\s*\n\s*REG:(\d+)", res))
    rows = []
    for func in re.split(r"\n\s*Function : ", sass)[1:]:
        name = func.split()[0]
        m = re.search(r"mla_decode_fp8_sm90ILi(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)E", name)
        if not m:
            continue
        nt, st, ctas, pipe, prmt = (int(x) for x in m.groups())
        body = loop_body(func)
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in body)
        top = ", ".join(f"{op} {c}" for op, c in ops.most_common(6))
        label = (f"cuda N{8 * nt} st{st} {ctas}/SM{' pipelined' if pipe else ''}, V by "
                 f"{'PRMT' if prmt else 'movmatrix'}")
        smem = st * nt * 8 * 592 + (2 if pipe else 1) * 4 * nt * 32 * 16
        cells = [label, usage.get(name, "?"), "-", f"{smem // 1024} KiB", str(ops["F2FP"]), str(ops["HMMA"]), "0",
                 str(ops["MOVM"]) + " movmatrix", "0", str(ops["LDL"] + ops["STL"]), str(len(body)),
                 f"{len(body) * 4 / (8 * nt):.0f}", top]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ptx/sass/ttgir per config here")
    ap.add_argument("--only", nargs="*", help="config names")
    args = ap.parse_args()
    print("| config | regs | stack | smem | cvt e4m3x2->f16x2 | mma.sync | wgmma | ldmatrix | 8-bit ld.shared | "
          "LDL/STL | loop instrs/warp | warp-instrs/token | top loop ops |")
    print("|" + "---|" * 13)
    for name, (cfg, kv, asm_widen) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        try:
            print(summarize(name, cfg, compile_for_gpu(cfg, kv, asm_widen=asm_widen), args.dump), flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:200]} |", flush=True)
    if not args.only:
        print("\n".join(cuda_rows()))


if __name__ == "__main__":
    main()
