# session 53 c3: the 16-bit GEMV's warps at 2 tokens (mw4) and the FP8 GEMV's wide rows (down) tile / warps
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"mw4":{"gemv_multi_token_warps":4},"dw8":{"fp8_gemv_wide_warps":8},"dw8t16":{"fp8_gemv_wide_warps":8,"fp8_gemv_wide_tile":16384},"dt16":{"fp8_gemv_wide_tile":16384},"dt64":{"fp8_gemv_wide_tile":65536},"dw8t64":{"fp8_gemv_wide_warps":8,"fp8_gemv_wide_tile":65536},"again":{}}'
VB='{"mw4":{"gemv_multi_token_warps":4},"again":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$VB" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1,2 --configs fp8 \
  --fp8-variants "$V" --out $OUT/ch > $OUT/ch.log 2>&1
echo "ch rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"mw4":{"gemv_multi_token_warps":4},"again":{},"mw4-fp8":{"gemv_multi_token_warps":4},"again-fp8":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log $OUT/ch.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-70
