#!/bin/bash
# One device call (run from the repository root, with $OUT set): the kernel and demo tests on CUDA, the A/B of tile
# configs, the full MLA decode table, then the demo's three KV reads at full GLM-5 geometry under CUDA graphs.
# Produced benchmarks/results/mla_decode_h200_2026-11-29.md (fourth pass) and the demo table next to it.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
DECODEGAP_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -n 8 tests/test_mla_decode.py tests/test_demo.py \
  > $OUT/gpu_tests.txt 2>&1
tail -3 $OUT/gpu_tests.txt; echo "tests $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 100 python3 ab_mla_decode.py --heads 16 128 --shapes 32x4096,128x16384 --splits2 \
  > $OUT/ab.txt 2>&1)
grep -E "^\|" $OUT/ab.txt; echo "ab $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 230 python3 bench_mla_decode.py --budget-s 70 --out $OUT/mla_decode_h200.md \
  > $OUT/bench.txt 2>&1)
grep -A8 "## Targets" $OUT/mla_decode_h200.md; echo "bench $(( $(date +%s) - T0 )) s"
timeout 200 python3 -m decodegap demo --compare --scale full --cuda-graph --timed 20 --steps 3 --warmup 2 \
  --no-shapes > $OUT/demo.txt 2>&1
tail -40 $OUT/demo.txt; echo "demo $(( $(date +%s) - T0 )) s"
