# written in session 57, not run: the tensor-core 1-token FP8 GEMV (s57_fp8_gemv_mma.patch, not kept on H100s) on an
# H200, where session 53 found the Triton GEMV issuing 60-80% of the SMs' slots at copy bandwidth. Apply first:
#   git apply benchmarks/results/session57/scripts/s57_fp8_gemv_mma.patch
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 240 python3 -m pytest -m cuda -q -rf --tb=short tests/kernels/test_fp8_gemv_cuda.py > $OUT/test.log 2>&1
echo "test rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"mma":{"fp8_gemv_mma":true},"mma rs4":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":4},"mma rs8 mb1":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":8,"fp8_gemv_mma_minb":1},"mma rs4 mb1":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":4,"fp8_gemv_mma_minb":1}}'
timeout 200 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1 --variants-json "$V" \
  --only "default,mma,mma rs4,mma rs8 mb1,mma rs4 mb1" --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
F='{"mma":{"fp8_gemv_mma":true},"mma no-norm":{"fp8_gemv_mma":true,"fp8_gemv_mma_norm":false},"again":{},"mma again":{"fp8_gemv_mma":true}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$F" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/test.log
grep -E "M=1 |^  " $OUT/ab.log | grep -v "skinny\|bf16" | cut -c1-130; grep -hE "^decode" $OUT/fp8.log | cut -c1-70
