#!/bin/bash
# One device call (run from the repository root, with $OUT set): the kernel and demo tests on CUDA, the full MLA
# decode table, the demo's three KV reads at full GLM-5 geometry under CUDA graphs, a short A/B of the CUDA
# stage-1 variants against Triton, and ncu on the default FP8 path (stage 1 + merge, H=16) and the H=128 kernel.
# Produced benchmarks/results/mla_decode_h200_2026-12-01.md (issue 17) and the demo table next to it.
# The device image lacks msgspec (the analysis core's decoder, which the demo's --compare and its tests use): carry
# its wheel in .whl/ (ignored; `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_17_x86_64 -d .whl msgspec==0.23.0` here) and name .whl in the call's carry.
if ls .whl/msgspec-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/msgspec-*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
DECODEGAP_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -n 8 tests/test_mla_decode.py tests/test_demo.py \
  > $OUT/gpu_tests.txt 2>&1
tail -2 $OUT/gpu_tests.txt; echo "tests $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 270 python3 bench_mla_decode.py --budget-s 60 --out $OUT/mla_decode_h200.md \
  > $OUT/bench.txt 2>&1)
grep -A12 "## Targets" $OUT/mla_decode_h200.md; echo "bench $(( $(date +%s) - T0 )) s"
timeout 120 python3 -m decodegap demo --compare --scale full --cuda-graph --timed 20 --steps 3 --warmup 2 \
  --no-shapes > $OUT/demo.txt 2>&1
tail -12 $OUT/demo.txt; echo "demo $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 30 python3 ab_mla_decode.py --heads 16 --shapes 32x4096,1x4096 --only \
  "cuda N32 st3 3/SM pipelined, V by PRMT (default)" "cuda N32 st4 2/SM, V by movmatrix" "cuda N32 st3 3/SM, V by PRMT" \
  "heads-major N32 w4 s2 r168 (triton default)" > $OUT/ab.txt 2>&1)
grep -E "^\| [0-9]" $OUT/ab.txt; echo "ab $(( $(date +%s) - T0 )) s"
NCU="ncu --clock-control none --launch-skip 4 --launch-count 2 --section SpeedOfLight --section Occupancy \
  --section SchedulerStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
(cd benchmarks && timeout 25 $NCU -k regex:mla_decode python3 ncu_mla_decode.py --heads 16 > $OUT/ncu_h16.txt 2>&1
 timeout 25 $NCU -k regex:tokens_major python3 ncu_mla_decode.py --heads 128 --calls 6 > $OUT/ncu_h128.txt 2>&1)
grep -hE "^  [a-z_<].*\(|Duration|DRAM Throughput|Issued Warp" $OUT/ncu_h16.txt $OUT/ncu_h128.txt | cut -c1-100
echo "ncu $(( $(date +%s) - T0 )) s"
