#!/bin/bash
# Device call 1 (from .gpu_kernels): CUDA tests in 4 parallel shards while the A/B variants compile in 4 more
# processes (fills triton's cache), then the timed A/B on an otherwise idle GPU.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
DECODEGAP_TEST_DEVICE=cuda python3 -m pytest --co -q tests/test_mla_decode.py 2>/dev/null | grep '::' > /tmp/ids.txt
wc -l < /tmp/ids.txt
split -n r/4 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do
  (DECODEGAP_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider $(cat $f) > $OUT/test_$(basename $f).log 2>&1; echo "rc=$?" >> $OUT/test_$(basename $f).log) &
done
W1='old default qKt N32 w4 s2|qKt vwide N32 w4 s2|qKt vwide N32 w4 s3|qKt vwide N32 w8 s2'
W2='qKt dv256 N32 w4 s2|qKt dv256 vwide N32 w4 s2|qKt dv256 vwide N32 w4 s3|qKt dv256 vwide N64 w4 s2'
W3='qKt dv256 vwide N32 w8 s2|qKt dv256 vwide N64 w8 s2|qKt dv128 vwide N64 w4 s2|old default H64 kqT N32 w8 s2'
W4='H64 kqT dv256 N32 w8 s2|H64 qKt dv256 vwide N32 w8 s2|bf16 old default qKt reuseV N32 w4 s2|bf16 qKt dv256 N32 w4 s2|bf16 qKt dv256 N32 w8 s2'
i=0
for W in "$W1" "$W2" "$W3" "$W4"; do
  i=$((i+1))
  IFS='|' read -ra NAMES <<< "$W"
  (cd benchmarks && python3 ab_mla_decode.py --warm --heads 16 128 --shapes 32x4096,128x16384 --only "${NAMES[@]}" > $OUT/warm$i.log 2>&1) &
done
wait
echo "tests+warm done at $(( $(date +%s) - T0 )) s"
tail -n 3 $OUT/test_*.log
cat $OUT/warm*.log | tail -n 20
cd benchmarks
python3 ab_mla_decode.py --heads 16 128 --shapes 32x4096 2>&1 | tee $OUT/ab1.md
python3 ab_mla_decode.py --heads 16 --shapes 128x16384 2>&1 | tee $OUT/ab2.md
echo "all done at $(( $(date +%s) - T0 )) s"
