#!/bin/bash
# One device call (run from the repository root, with $OUT set), issue 22: the wgmma building-block probe, a smoke
# check and A/B of the wgmma variants (the fastest FP8 one is used for the rest of the call), the MLA kernel tests
# on CUDA, the side-by-side table against FlashInfer (fa3, fa2) with every decodegap path, the demo's three KV
# reads at full GLM-5 geometry, and ncu on the wgmma kernel (H=128, FP8 and BF16) and the <= 16-head FP8 kernel.
# Logs under $OUT; a short table last. Produced benchmarks/results/mla_decode_flashinfer_h200_2026-12-01.md and
# mla_decode_tok_h200_2026-12-01.md (issue 22).
# Carry: .whl (msgspec, which the device image lacks: `pip download --no-deps --only-binary=:all: --python-version
# 3.12 --platform manylinux_2_17_x86_64 -d .whl msgspec==0.20.0` here) and .flashinfer_peer (the pruned FlashInfer
# copy of ../shared/tools/flashinfer_peer.sh DIR, with the four MLA modules prebuilt into flashinfer/data/aot/ by
# benchmarks/mla_flashinfer_aot.sh; without them FlashInfer JIT-builds them here, about a minute each).
# Steps: STEPS="probe tok tests bench demo ncu ncu16" (default all). tok: the <= 16-head tokens-major kernel's smoke
# and A/B (benchmarks/mla_tok_ab.py, TOK_SHAPES=... to choose); ncu16: ncu on it at B=32 ctx 4096 (with the merge
# kernel) and B=128 ctx 16384 (H=16); DEMO_TOK=1: the demo again with the tokens-major kernel forced; ncu128: the
# two H=128 ncu runs of ncu alone. probe's A/B picks the fastest FP8 and BF16 wgmma variants for the rest of the call
# (DECODEGAP_MLA_WGMMA_FP8 / _BF16); a variant wrong in the smoke check is left out of it; WGMMA_AB=0,8,... limits
# that A/B to these variants. BENCH_ARGS: more bench_mla_decode.py flags (e.g. --clean-l2: decodegap and fa3 also
# timed with the L2 flushed by reads). ncu16c: ncu on the tokens-major kernel and its merge kernel at B=32 ctx 4096
# (H=16, the default combine). The tests step gets the time left of CALL_S (default 585) seconds since the start, at most 300.
# 2026-12-02 (benchmarks/results/mla_decode_h200_2026-12-02.md): the cluster combine and the chained wgmma variants.
# 2026-12-02, later (mla_decode_h200_2026-12-02-seesaw.md): the seesaw wgmma variants; NO_PROBE=1 skips the
# building-block probe (smoke check and A/B only).
# 2026-12-02, fifth (mla_decode_h200_2026-12-02-pdl.md): TOK_AB_ARGS=--small for the small-problem A/B; WGMMA_AB must
# name at least one variant of each cache (else the smoke step exits 1 and the sm_90 kernels are off for the call).
# 2026-12-02, eighth: limits (benchmarks/mla_wgmma_limits.py, LIMITS_ARGS=...): the wgmma variants with the
# producer's copies or the consumers' math left out; ncu128 also reads the L2's throughput and the L2 -> SM bytes.
# 2026-12-03: ncudram (NCUD_SHAPES="32x4096 128x16384"): the H=128 wgmma kernel's DRAM bytes, L2 hits, tensor pipe.
# 2026-12-06: floor (benchmarks/mla_read_floor.py, FLOOR_SHAPES=...): a kernel that only reads the live KV, timed alike.
# 2026-12-06, fourth session: ncupipe (NCUP_VARIANTS=...): each pipe's share of its peak in the many-head kernel.
STEPS=${STEPS:-probe tok tests bench demo ncu ncu16}
T0=$(date +%s)
since() { echo "== $1 $(( $(date +%s) - T0 )) s"; }
SITE=/tmp/site
if ls .whl/msgspec-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE .whl/msgspec-*.whl
fi
FIPATH=
if [ -f .flashinfer_peer/flashinfer_pruned.tgz ]; then
  mkdir -p /tmp/fi && tar xzf .flashinfer_peer/flashinfer_pruned.tgz -C /tmp/fi \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE \
      .flashinfer_peer/apache_tvm_ffi-*.whl && FIPATH=/tmp/fi
fi
export PYTHONPATH=$PWD/src:$SITE${FIPATH:+:$FIPATH} PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
since setup

if [[ " $STEPS " == *" probe "* ]]; then
  if [ -z "$NO_PROBE" ]; then  # NO_PROBE=1: only the smoke check and A/B of the variants
    timeout 60 python3 benchmarks/mla_wgmma_probe.py > $OUT/probe.txt 2>&1; echo "probe rc=$?"; tail -4 $OUT/probe.txt
  fi
  (cd benchmarks && timeout 170 python3 mla_wgmma_smoke.py --ab --pick /tmp/fp8_variant --pick-bf16 /tmp/bf16_variant \
    ${WGMMA_AB:+--variants $WGMMA_AB} > /tmp/smoke.txt 2>&1)
  rc=$?; cat /tmp/smoke.txt >> $OUT/probe.txt; echo "smoke rc=$rc"; grep -E "WRONG|ab:" /tmp/smoke.txt | cut -c1-120; tail -1 /tmp/smoke.txt
  if [ $rc -ne 0 ]; then export DECODEGAP_MLA_WGMMA=0; echo "wgmma kernel off for the rest of this call"; fi
  if [ -s /tmp/fp8_variant ]; then export DECODEGAP_MLA_WGMMA_FP8=$(cat /tmp/fp8_variant); fi
  if [ -s /tmp/bf16_variant ]; then export DECODEGAP_MLA_WGMMA_BF16=$(cat /tmp/bf16_variant); fi
  echo "wgmma variants for the rest of this call: FP8 ${DECODEGAP_MLA_WGMMA_FP8:-default}, BF16 ${DECODEGAP_MLA_WGMMA_BF16:-default}"
  since probe
fi
if [[ " $STEPS " == *" floor "* ]]; then  # what only reading the live KV takes at each size (mla_read_floor.py)
  (cd benchmarks && timeout 150 python3 mla_read_floor.py ${FLOOR_SHAPES:+--shapes $FLOOR_SHAPES} > $OUT/floor.txt 2>&1)
  echo "floor rc=$?"; grep -E "^\||copy|Error" $OUT/floor.txt | cut -c1-200
  since floor
fi
if [[ " $STEPS " == *" limits "* ]]; then  # the wgmma kernel as built, consumers alone, producer alone
  (cd benchmarks && timeout 240 python3 mla_wgmma_limits.py ${LIMITS_ARGS} > $OUT/limits.txt 2>&1)
  echo "limits rc=$?"; grep -E "^\||Error|error" $OUT/limits.txt | cut -c1-160
  since limits
fi
if [[ " $STEPS " == *" tok "* ]]; then
  (cd benchmarks && timeout 60 python3 mla_tok_ab.py --smoke-only > $OUT/tok_ab.txt 2>&1); rc=$?
  echo "tok smoke rc=$rc"; grep -E "WRONG|tok kernel|Error|error:" $OUT/tok_ab.txt | head -12
  if [ $rc -eq 0 ]; then
    (cd benchmarks && timeout 170 python3 mla_tok_ab.py ${TOK_SHAPES:+--shapes $TOK_SHAPES} $TOK_AB_ARGS >> $OUT/tok_ab.txt 2>&1)
    echo "tok ab rc=$?"; grep -E "^\| [0-9]|^copy" $OUT/tok_ab.txt | cut -c1-160
  fi
  since tok
fi
if [[ " $STEPS " == *" tests "* ]]; then
  left=$(( ${CALL_S:-585} - ($(date +%s) - T0) )); [ $left -gt 300 ] && left=300
  python3 -c "import torch; from decodegap.kernels import mla_decode_sm90 as m; [f(0) for f in (m._library, m._tok_library, m._wgmma_library)]"
  DECODEGAP_TEST_DEVICE=cuda timeout $left python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla_decode.py \
    > $OUT/gpu_tests.txt 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.txt | tail -12
  since tests
fi
if [[ " $STEPS " == *" bench "* ]]; then
  (cd benchmarks && timeout ${BENCH_S:-300} python3 bench_mla_decode.py --no-grid --out $OUT/mla_decode_h200.md \
    $BENCH_ARGS > $OUT/bench.txt 2>&1); echo "bench rc=$?"
  since bench
fi
if [[ " $STEPS " == *" demo "* ]]; then
  timeout 150 python3 -m decodegap demo --compare --scale full --cuda-graph --timed 20 --steps 3 --warmup 2 \
    --no-shapes > $OUT/demo.txt 2>&1; echo "demo rc=$?"; tail -8 $OUT/demo.txt
  if [ -n "$DEMO_TOK" ]; then  # again with the tokens-major kernel forced (the demo's B=1 runs mma.sync by default)
    DECODEGAP_MLA_FP8_VARIANT=3 timeout 150 python3 -m decodegap demo --compare --scale full --cuda-graph --timed 20 \
      --steps 3 --warmup 2 --no-shapes > $OUT/demo_tok.txt 2>&1; echo "demo (tok forced) rc=$?"; tail -8 $OUT/demo_tok.txt
  fi
  since demo
fi
if [[ " $STEPS " == *" ncu "* || " $STEPS " == *" ncu128 "* ]]; then
  NCU="ncu --clock-control none --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:^l1tex__data_pipe_lsu_wavefronts_mem_shared.sum$,regex:^l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum$,lts__t_bytes.sum.per_second,lts__t_sector_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed"
  (cd benchmarks
   timeout 60 $NCU -k "regex:wgmma|tok_wide" python3 ncu_mla_decode.py --heads 128 > $OUT/ncu_h128_fp8.txt 2>&1
   timeout 60 $NCU -k regex:wgmma python3 ncu_mla_decode.py --heads 128 --cache bf16 > $OUT/ncu_h128_bf16.txt 2>&1
   if [[ " $STEPS " == *" ncu "* ]]; then
     timeout 60 $NCU -k regex:mla_decode_fp8 python3 ncu_mla_decode.py --heads 16 > $OUT/ncu_h16_fp8.txt 2>&1
   fi)
  for f in $OUT/ncu_h128_fp8.txt $OUT/ncu_h128_bf16.txt $OUT/ncu_h16_fp8.txt; do
    [ -f $f ] || continue
    echo "-- $(basename $f)"
    grep -E "^    (Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issued Warp|Shared Memory Throughput|L1/TEX Hit|Executed Ipc A)" $f \
      | sed 's/  */ /g' | head -12
    grep -E "pipe_tensor|wavefronts_mem_shared|bank_conflicts|lts__t_|lts__thr|xbar2l1tex|stalled_(long_scoreboard|barrier|wait|math_pipe|short_scoreboard|mio_throttle|lg_throttle|dispatch|membar|sleeping|selected|no_instruction)_per" $f \
      | sed 's/  */ /g' | head -20
  done
  since ncu
fi
if [[ " $STEPS " == *" ncupipe "* ]]; then  # which pipes the many-head kernel keeps busy (B=32 ctx 4096 H=128;
  # NCUP_VARIANTS="42 51": each variant's kernel alone, instructions a pipe and cycles a pipe, % of peak while active)
  NCUP="ncu --clock-control none --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum,regex:^sm__inst_executed_pipe_[a-z0-9_]+\.avg\.pct_of_peak_sustained_active$,regex:^sm__pipe_[a-z0-9_]+_cycles_active\.avg\.pct_of_peak_sustained_active$,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active"
  for v in ${NCUP_VARIANTS:-42}; do
    (cd benchmarks && DECODEGAP_MLA_WGMMA_FP8=$v timeout 90 $NCUP -k regex:tok_wide python3 ncu_mla_decode.py --heads 128 \
      > $OUT/ncup_$v.txt 2>&1); echo "-- variant $v rc=$?"
    grep -E "gpu__time|pipe|wavefronts|issue_active" $OUT/ncup_$v.txt | sed 's/  */ /g' | awk '$NF+0 >= 1 || /gpu__time/'
  done
  since ncupipe
fi
if [[ " $STEPS " == *" ncudram "* ]]; then  # the wgmma kernel's DRAM bytes against the cache's (the two head-block
  # CTAs of a sequence share its KV reads through the L2 only while they stay in step), tensor pipe, shared memory
  NCUD="ncu --clock-control none --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed"
  (cd benchmarks
   for shape in ${NCUD_SHAPES:-32x4096 128x16384}; do
     for cache in fp8 bf16; do
       timeout 90 $NCUD -k regex:wgmma python3 ncu_mla_decode.py --heads 128 --batch ${shape%x*} --ctx ${shape#*x} \
         --cache $cache > $OUT/ncud_${shape}_$cache.txt 2>&1
       echo "-- B x ctx $shape H 128 $cache"; grep -E "gpu__time|dram__bytes|lts__t_sector|pipe_tensor|bank_" $OUT/ncud_${shape}_$cache.txt | sed 's/  */ /g'
     done
   done)
  since ncudram
fi
if [[ " $STEPS " == *" ncu16 "* ]]; then
  NCU16="ncu --clock-control none --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum.per_second,regex:^l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum$"
  (cd benchmarks
   timeout 90 $NCU16 -k regex:mla_decode_tok python3 ncu_mla_decode.py --heads 16 > $OUT/ncu_h16_tok.txt 2>&1
   timeout 90 ${NCU16/--launch-count 1/--launch-count 2} -k "regex:mla_decode_tok|mla_decode_merge" python3 \
     ncu_mla_decode.py --heads 16 --inline-max 0 > $OUT/ncu_h16_tok_merge.txt 2>&1
   timeout 120 $NCU16 -k regex:mla_decode_tok python3 ncu_mla_decode.py --heads 16 --batch 128 --ctx 16384 \
     > $OUT/ncu_h16_tok_b128.txt 2>&1)
  grep -E "^  [a-zA-Z_].*\(|^    Duration" $OUT/ncu_h16_tok_merge.txt | sed 's/  */ /g' | cut -c1-100
  for f in $OUT/ncu_h16_tok.txt $OUT/ncu_h16_tok_b128.txt; do
    echo "-- $(basename $f)"
    grep -E "^    (Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issued Warp|Issue Slots Busy|Executed Ipc A|Theoretical Occ)" $f \
      | sed 's/  */ /g' | head -12
    grep -E "dram__bytes_read|sm__pipe_tensor_cycles_active|bank_conflicts|stalled_(long_scoreboard|barrier|wait|math_pipe_throttle|short_scoreboard|mio_throttle|lg_throttle|dispatch_stall|membar|selected|no_instruction|gmma)_per" $f \
      | sed 's/  */ /g;s/smsp__average_warps_issue_stalled_//;s/_per_issue_active.ratio//' | head -16
    grep -E "inst_executed_pipe_" $f | sed 's/  */ /g' | sort -t' ' -k4 -rn | awk '$NF+0 > 3' | head -8
  done
  since ncu16
fi
if [[ " $STEPS " == *" ncu16c "* ]]; then
  NCU16C="ncu --clock-control none --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --section WarpStateStats --metrics dram__bytes_read.sum.per_second,dram__bytes_write.sum"
  (cd benchmarks  # each eager call: the tokens-major kernel, then the merge kernel (where its cluster does not combine)
   timeout 90 $NCU16C --launch-skip 4 --launch-count 2 -k "regex:mla_decode_tok|_mla_decode_merge" python3 \
     ncu_mla_decode.py --heads 16 > $OUT/ncu_h16_tok_b32.txt 2>&1
   timeout 90 $NCU16C --launch-skip 2 --launch-count 1 -k regex:mla_decode_tok python3 ncu_mla_decode.py --heads 16 \
     --batch 128 --ctx 4096 > $OUT/ncu_h16_tok_b128.txt 2>&1)
  for f in $OUT/ncu_h16_tok_b32.txt $OUT/ncu_h16_tok_b128.txt; do
    echo "-- $(basename $f)"
    grep -E "^  [a-zA-Z_].*\(|^    (Duration|DRAM Throughput|Achieved Occupancy|Issue Slots Busy|SM Frequency)|dram__bytes|stall|WARNING" \
      $f | sed 's/  */ /g' | cut -c1-110 | head -16
  done
  since ncu16c
fi
if [ -f $OUT/mla_decode_h200.md ]; then
  sed -n '/^## Side by side/,$p' $OUT/mla_decode_h200.md | grep -E "^\||^- " | cut -c1-230
fi
