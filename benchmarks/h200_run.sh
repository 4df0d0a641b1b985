#!/bin/bash
# one device call: CUDA tests (3 shards in parallel, to overlap compiles), sweep + full table, A/B at B=128 ctx 16k
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1 DECODEGAP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
t0=$(date +%s)
timeout 110 python3 -m pytest -q tests/test_mla_decode.py -k "matches_reference" > $OUT/test_a.txt 2>&1 &
timeout 110 python3 -m pytest -q tests/test_mla_decode.py -k "tile_variants" > $OUT/test_b.txt 2>&1 &
timeout 110 python3 -m pytest -q tests/test_mla_decode.py -k "not matches_reference and not tile_variants" > $OUT/test_c.txt 2>&1 &
wait
for f in $OUT/test_*.txt; do echo "== $f"; tail -n 4 $f; done
echo "tests took $(( $(date +%s) - t0 )) s"
timeout 200 python3 benchmarks/bench_mla_decode.py --sweep --budget-s 70 --out $OUT/bench.md > $OUT/bench_log.txt 2>&1
echo "bench rc $? at $(( $(date +%s) - t0 )) s"
timeout 45 python3 benchmarks/ab_mla_decode.py --heads 16 --shapes 128x16384 > $OUT/ab.txt 2>&1
echo "ab rc $? at $(( $(date +%s) - t0 )) s"
cat $OUT/ab.txt
grep -A8 "^## Targets" $OUT/bench.md
grep -B2 -A40 "^## Sweep" $OUT/bench.md | head -45
