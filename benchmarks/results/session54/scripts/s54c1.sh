# for session 54's first call (an H200 if one comes; the H100 too): what session 53 left unmeasured.
# 1. fp8_gemv_x_once (off): x loaded once for a 1-token program's rounds; its CUDA kernel tests, then batch 1 A/B
#    (block, per-channel; Qwen3-30B-A3B with block-FP8 attention projections). Also x copies for 4-row blocks (x4).
# 2. moe_gemv_multi_warps = 4 (on, measured on H100s only): the H200 A/B against 8 (m8).
# 3. issue 25 / 26 rows on an H200 with session 53's defaults.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 python3 -m pytest -q tests/kernels/test_fp8_kernels.py -k "gemv and (x-once or x-rows)" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"xo":{"fp8_gemv_x_once":true},"x4":{"fp8_gemv_x_rows_max":4},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/chn > $OUT/chn.log 2>&1
echo "chn rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"m8":{"moe_gemv_multi_warps":8},"again":{},"ckpt-xo-fp8":{"fp8_gemv_x_once":true},"ckpt-again-fp8":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,3,4 --contexts 512 \
  --variants new,ckpt-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8,32,128 --configs bf16,fp8 \
  --out $OUT/rows25 > $OUT/rows25.log 2>&1
echo "rows25 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --out $OUT/rows26 > $OUT/rows26.log 2>&1
echo "rows26 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/t.log; grep -hE "^decode" $OUT/fp8.log $OUT/chn.log $OUT/rows25.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log $OUT/rows26.log | cut -c1-75
