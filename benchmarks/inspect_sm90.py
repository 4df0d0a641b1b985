"""Compile the MLA split kernel for sm_90 without a GPU and summarize what it became (registers, spills, shared
memory, and the instructions that matter: e4m3 conversions, mma/wgmma, shared-memory and global loads).

    PYTHONPATH=src python3 benchmarks/inspect_sm90.py [--dump DIR]

Runs on a CPU machine with triton's bundled ptxas/cuobjdump; on a GPU machine it does the same.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from decodegap.kernels.mla_decode_triton import Config, _split_kernel  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

CONFIGS = {
    "qKt fp16 N32 (2026-11-29 default)": (Config(16, 32, 4, 2, kt=True), "fp8e4nv", 16),
    "qKt fp16 N64": (Config(16, 64, 4, 2, kt=True), "fp8e4nv", 16),
    "qKt reuse fp16 N32": (Config(16, 32, 4, 2, kt=True, reuse_v=True), "fp8e4nv", 16),
    # 1. V widened before the dot (staged as fp16: ldmatrix.trans)
    "qKt vwide N32": (Config(16, 32, 4, 2, kt=True, v_wide=True), "fp8e4nv", 16),
    "qKt vwide N64": (Config(16, 64, 4, 2, kt=True, v_wide=True), "fp8e4nv", 16),
    "qKt vwide N32 s3": (Config(16, 32, 4, 3, kt=True, v_wide=True), "fp8e4nv", 16),
    # 2. the 512 output columns split over 2 (or 4) programs
    "qKt dv256 N32": (Config(16, 32, 4, 2, kt=True, block_dv=256), "fp8e4nv", 16),
    "qKt dv256 N64": (Config(16, 64, 4, 2, kt=True, block_dv=256), "fp8e4nv", 16),
    "qKt dv256 N32 s3": (Config(16, 32, 4, 3, kt=True, block_dv=256), "fp8e4nv", 16),
    "qKt dv256 N32 w8": (Config(16, 32, 8, 2, kt=True, block_dv=256), "fp8e4nv", 16),
    # 1 + 2
    "qKt dv256 vwide N32": (Config(16, 32, 4, 2, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt dv256 vwide N64": (Config(16, 64, 4, 2, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt dv256 vwide N32 s3": (Config(16, 32, 4, 3, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt dv256 vwide N64 s3": (Config(16, 64, 4, 3, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt dv256 vwide N32 w8": (Config(16, 32, 8, 2, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt dv256 vwide N64 w8": (Config(16, 64, 8, 2, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt vwide N32 w8": (Config(16, 32, 8, 2, kt=True, v_wide=True), "fp8e4nv", 16),
    "qKt dv256 vwide N32 w8 s3": (Config(16, 32, 8, 3, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "qKt dv128 vwide N64": (Config(16, 64, 4, 2, kt=True, block_dv=128, v_wide=True), "fp8e4nv", 16),
    "kqT dv256 vwide N64": (Config(16, 64, 4, 2, block_dv=256, v_wide=True), "fp8e4nv", 16),
    # H=128 (compute-bound)
    "H64 kqT fp16 N32 w8 (default)": (Config(64, 32, 8, 2), "fp8e4nv", 16),
    "H64 kqT vwide N32 w8": (Config(64, 32, 8, 2, v_wide=True), "fp8e4nv", 16),
    "H64 kqT dv256 vwide N32 w8": (Config(64, 32, 8, 2, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "H64 qKt dv256 vwide N32 w8": (Config(64, 32, 8, 2, kt=True, block_dv=256, v_wide=True), "fp8e4nv", 16),
    "H64 kqT dv256 N32 w8": (Config(64, 32, 8, 2, block_dv=256), "fp8e4nv", 16),
    # BF16 cache
    "bf16 qKt reuse N32 (default)": (Config(16, 32, 4, 2, kt=True, reuse_v=True), "bf16", 16),
    "bf16 qKt dv256 N32": (Config(16, 32, 4, 2, kt=True, block_dv=256), "bf16", 16),
}


def compile_one(cfg: Config, kv: str, split: bool = True):
    dot = {"fp8e4nv": tl.float16 if cfg.widen != "bf16" else tl.bfloat16, "bf16": tl.bfloat16}[kv]
    sig = {
        "q_ptr": "*bf16", "kv_ptr": f"*{kv}", "table_ptr": "*i32", "lens_ptr": "*i32",
        "out_ptr": "*bf16", "lse_ptr": "*fp32", "part_ptr": "*fp32", "part_lse_ptr": "*fp32",
        "q_scale": "fp32", "s_scale": "fp32", "out_scale": "fp32", "num_heads": "i32", "num_splits": "i32",
        "stride_qb": "i32", "stride_qh": "i32", "stride_page": "i32", "stride_slot": "i32", "stride_tb": "i32",
        "stride_ob": "i32", "stride_oh": "i32", "stride_pb": "i32", "stride_ph": "i32",
    }
    const = dict(PAGE_SIZE=64, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DL=512, DR=64, SPLIT=split,
                 RETURN_LSE=False, DOT_DTYPE=dot, KT=cfg.kt, REUSE_V=cfg.reuse_v,
                 BLOCK_DV=cfg.block_dv, V_WIDE=cfg.v_wide)
    for k in const:
        sig[k] = "constexpr"
    names = _split_kernel.arg_names
    div = CUDABackend.parse_attr("D")
    aligned = ["q_ptr", "kv_ptr", "table_ptr", "lens_ptr", "out_ptr", "lse_ptr", "part_ptr", "part_lse_ptr",
               "stride_qb", "stride_qh", "stride_page", "stride_slot", "stride_ob", "stride_oh", "stride_pb"]
    attrs = {(names.index(n),): div for n in aligned}
    src = ASTSource(_split_kernel, sig, const, attrs)
    return triton.compile(src, target=TARGET, options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def summarize(name: str, k, dump: str | None) -> str:
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

    pats = [r"cvt\.rn\.f16x2\.e4m3x2", r"cvt\.rn\.bf16x2\.f32|cvt\.rn\.bf16\.f32", r"mma\.sync",
            r"wgmma\.mma_async", r"ldmatrix", r"ldmatrix[.a-z0-9]*\.trans", r"ld\.shared", r"ld\.shared\.[bu]8",
            r"cp\.async\.(?:ca|cg)", r"ld\.global", r"st\.shared"]
    cols = [str(n(p, ptx)) for p in pats] + [str(n(r"\b(?:LDL|STL)\b", sass)),  # spill traffic (SASS)
                                             str(n(r"(?m)^\s+/\*[0-9a-f]+\*/", sass))]
    head = [name, regs.group(1) if regs else "?", stack.group(1) if stack else "?", f"{k.metadata.shared // 1024} KiB"]
    return "| " + " | ".join(head + cols) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ptx/sass/ttgir per config here")
    ap.add_argument("--only", nargs="*", help="config names")
    args = ap.parse_args()
    print("| config | regs | stack | smem | cvt e4m3x2->f16x2 | cvt ->bf16 | mma.sync | wgmma | ldmatrix | "
          "ldmatrix.trans | ld.shared | ld.shared.8bit | cp.async | ld.global | st.shared | LDL/STL (SASS) | SASS instrs |")
    print("|" + "---|" * 17)
    for name, (cfg, kv, _h) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        try:
            k = compile_one(cfg, kv)
            print(summarize(name, k, args.dump), flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:200]} |", flush=True)


if __name__ == "__main__":
    main()
