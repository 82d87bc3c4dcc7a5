# session 57 c3: the tensor-core GEMV with x's exponent per 64-column step (one barrier before the products, no
# block-wide max) and 2 programs a SM by default: CUDA tests, the kernel alone over launches, Llama-3-8B FP8 decode
# at batch 1 (block, then per-channel) on / off / without the norm-prologue calls
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 240 python3 -m pytest -m cuda -q -rf --tb=short tests/kernels/test_fp8_gemv_cuda.py > $OUT/test.log 2>&1
echo "test rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"mma":{"fp8_gemv_mma":true},"mma rs4":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":4},"mma rs8 mb1":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":8,"fp8_gemv_mma_minb":1},"mma rs4 mb1":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":4,"fp8_gemv_mma_minb":1},"mma w4 mb4":{"fp8_gemv_mma":true,"fp8_gemv_mma_warps":4,"fp8_gemv_mma_minb":4},"mma rs1":{"fp8_gemv_mma":true,"fp8_gemv_mma_round_steps":1}}'
timeout 200 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1 --variants-json "$V" \
  --only "default,mma,mma rs4,mma rs8 mb1,mma rs4 mb1,mma w4 mb4,mma rs1" --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
F='{"mma":{"fp8_gemv_mma":true},"mma no-norm":{"fp8_gemv_mma":true,"fp8_gemv_mma_norm":false},"again":{},"mma again":{"fp8_gemv_mma":true}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$F" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT ab fp8 2>/dev/null; rm -rf $OUT/ab $OUT/fp8
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/test.log; grep -E "^E  |Error" $OUT/test.log | sort | uniq -c | sort -rn | head -20
grep -E "M=1 |^  " $OUT/ab.log | grep -v "skinny\|bf16" | cut -c1-130; grep -hE "^decode" $OUT/fp8.log | cut -c1-70
