#!/bin/bash
# Prebuild FlashInfer's four MLA decode modules (fa3 / fa2 x bf16 / e4m3 caches, bf16 q, 512 + 64 dims) for sm_90a
# on a machine WITHOUT a GPU, and put them into the pruned copy's flashinfer/data/aot/, where FlashInfer loads them
# without JIT-building (saves ~4 minutes of device time per call). Needs nvcc (CUDA 13, as on the H200 image),
# a Python with torch, and DIR from ../shared/tools/flashinfer_peer.sh DIR.
#   PYTHON=.venv/bin/python bash benchmarks/mla_flashinfer_aot.sh .flashinfer_peer
# The modules link libcuda.so.1 at load time only: a stub libcuda.so satisfies the link here.
set -euo pipefail
DIR=$(realpath "${1:?peer dir}"); PY=${PYTHON:-python3}; W=$(mktemp -d)
mkdir -p "$W/fi" "$W/site" "$W/stub"
tar xzf "$DIR/flashinfer_pruned.tgz" -C "$W/fi"
PYV=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
$PY -m pip download -q --no-deps --only-binary=:all: -d "$W/whl" apache-tvm-ffi==0.1.15.post2 \
  --python-version "$PYV" --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
$PY -m pip install -q --no-deps --target "$W/site" "$W"/whl/*.whl
echo "" | gcc -shared -Wl,-soname,libcuda.so.1 -o "$W/stub/libcuda.so" -x c -
export PYTHONPATH="$W/fi:$W/site" FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$W/ws" \
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-2} LIBRARY_PATH="$W/stub"
$PY - "$W/fi/flashinfer/data/aot" <<'EOF'
import shutil, sys, time
from pathlib import Path
import torch
from flashinfer.jit import gen_batch_mla_module
aot = Path(sys.argv[1])
for backend in ("fa3", "fa2"):
    for kv in (torch.bfloat16, torch.float8_e4m3fn):
        t = time.time()
        spec = gen_batch_mla_module(backend, torch.bfloat16, kv, torch.bfloat16, torch.int32, 512, 64, False)
        spec.build()
        dst = aot / spec.name / f"{spec.name}.so"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, dst)
        print(f"{spec.name}: {time.time() - t:.0f} s", flush=True)
EOF
(cd "$W/fi" && tar czf "$DIR/flashinfer_pruned.tgz" flashinfer)
ls -la "$DIR"; rm -rf "$W"
