# session 58 c1: issue 25's 4k prefill on one torch CPU thread (host_threads, session 57's default), per-channel and
# block FP8 against bf16 in the same process (with a repeat of both); on an H200 also session 57's tensor-core
# 1-token FP8 GEMV (next_s58c1.sh) and the e4m3 KV decode attention against copy bandwidth
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
for kind in channel block; do
  timeout 170 taskset -c 0-15 python3 benchmarks/bench_fp8.py --prefill-only --kind $kind --prefill-variants '{"again": {}}' \
    --out $OUT/pre_$kind > $OUT/pre_$kind.log 2>&1
  echo "pre $kind rc=$? $(date +%T)" >> $OUT/rc.txt
done
if grep -q H200 $OUT/gpus.txt; then
  timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --out $OUT/kv > $OUT/kv.log 2>&1
  echo "kv rc=$? $(date +%T)" >> $OUT/rc.txt
  git apply benchmarks/results/session57/scripts/s57_fp8_gemv_mma.patch && echo "patch applied" >> $OUT/rc.txt
  timeout 150 python3 -m pytest -m cuda -q -rf --tb=short tests/kernels/test_fp8_gemv_cuda.py > $OUT/test.log 2>&1
  echo "test rc=$? $(date +%T)" >> $OUT/rc.txt
  V='{"mma":{"fp8_gemv_mma":true},"mma rs4":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":4},"mma rs4 mb1":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":4,"fp8_gemv_mma_minb":1}}'
  timeout 120 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1 --variants-json "$V" \
    --only "default,mma,mma rs4,mma rs4 mb1" --out $OUT/ab > $OUT/ab.log 2>&1
  echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
  F='{"mma":{"fp8_gemv_mma":true},"again":{},"mma again":{"fp8_gemv_mma":true}}'
  timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
    --fp8-variants "$F" --out $OUT/fp8 > $OUT/fp8.log 2>&1
  echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
fi
cat $OUT/gpus.txt $OUT/rc.txt
for k in channel block; do echo "== $k"; grep -hE "^prefill [0-9]" $OUT/pre_$k.log | cut -c1-150; done
if [ -f $OUT/kv.log ]; then grep -iE "copy|B=" $OUT/kv.log | tail -20 | cut -c1-150; tail -2 $OUT/test.log
  grep -E "M=1 |^  " $OUT/ab.log | grep -v "skinny\|bf16" | cut -c1-130; grep -hE "^decode" $OUT/fp8.log | cut -c1-70; fi
