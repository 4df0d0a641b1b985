#!/bin/bash
# The device call (run from the copy's root, e.g. .gpu_kernels): CUDA tests in 4 parallel shards while the A/B
# variants compile in 4 more processes (fills triton's cache); then the timed A/B on an idle GPU, which writes
# its picks; then, if the FP8 H<=16 pick is not the old default, the full table with those picks.
set -u
ROOT=$PWD
export PYTHONPATH=$ROOT/src PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
DECODEGAP_TEST_DEVICE=cuda python3 -m pytest --co -q tests/test_mla_decode.py 2>/dev/null | grep '::' \
  | sed 's#^.*tests/#tests/#' > /tmp/ids.txt
echo "$(wc -l < /tmp/ids.txt) tests"
split -n r/4 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do
  (DECODEGAP_TEST_DEVICE=cuda timeout 140 python3 -m pytest -q -p no:cacheprovider $(cat $f) \
     > $OUT/test_$(basename $f).log 2>&1; echo "rc=$?" >> $OUT/test_$(basename $f).log) &
done
W1='old default qKt N32 w4 s2|qKt vwide N32 w4 s2|qKt vwide N32 w4 s3|qKt vwide N32 w8 s2'
W2='qKt dv256 N32 w4 s2|qKt dv256 vwide N32 w4 s2|qKt dv256 vwide N32 w4 s3|qKt dv256 vwide N64 w4 s2'
W3='qKt dv256 vwide N32 w8 s2|qKt dv256 vwide N64 w8 s2|qKt dv128 vwide N64 w4 s2|old default H64 kqT N32 w8 s2'
W4='H64 kqT dv256 N32 w8 s2|H64 qKt dv256 vwide N32 w8 s2|bf16 old default qKt reuseV N32 w4 s2|bf16 qKt dv256 N32 w4 s2|bf16 qKt dv256 N32 w8 s2'
i=0
for W in "$W1" "$W2" "$W3" "$W4"; do
  i=$((i+1))
  IFS='|' read -ra NAMES <<< "$W"
  (cd benchmarks && timeout 170 python3 ab_mla_decode.py --warm --shapes 32x4096:16+128,128x16384:16 \
     --only "${NAMES[@]}" > $OUT/warm$i.log 2>&1; echo "rc=$?" >> $OUT/warm$i.log) &
done
wait
echo "tests+warm done at $(( $(date +%s) - T0 )) s"
tail -q -n 2 $OUT/test_*.log
grep -h -E "rc=|Error|error" $OUT/warm*.log | sort | uniq -c | head
cd benchmarks
timeout 120 python3 ab_mla_decode.py --shapes 32x4096:16+128,128x16384:16 --pick $OUT/pick.json 2>&1 | tee $OUT/ab.md
echo "A/B done at $(( $(date +%s) - T0 )) s"
if [ -f $OUT/pick.json ] && python3 -c "import json,sys; sys.exit(json.load(open('$OUT/pick.json'))['fp8,16']['name'].startswith('old default'))"; then
  timeout $(( 330 - ($(date +%s) - T0) )) python3 bench_mla_decode.py --budget-s 40 --tuned $OUT/pick.json \
    --out $OUT/table.md > $OUT/bench.log 2>&1
  echo "bench rc=$? at $(( $(date +%s) - T0 )) s"; grep -A8 "^## Targets" $OUT/bench.log
else
  echo "no new FP8 pick: bench skipped"
fi
