# session 53 c6: the FP8 GEMV's x loaded a copy a row in blocks of up to 2 / 4 rows (x2 / x4), with down at 64k weights
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 python3 -m pytest -q tests/kernels/test_fp8_kernels.py -k "gemv and x-rows" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"x2":{"fp8_gemv_x_rows_max":2},"x4":{"fp8_gemv_x_rows_max":4},"x4dt64":{"fp8_gemv_x_rows_max":4,"fp8_gemv_wide_tile":65536},"again":{},"x2b":{"fp8_gemv_x_rows_max":2}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/chn > $OUT/chn.log 2>&1
echo "chn rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"ckpt-x2-fp8":{"fp8_gemv_x_rows_max":2},"ckpt-again-fp8":{}}'
timeout 120 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1 --contexts 512 \
  --variants ckpt-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/t.log; grep -hE "^decode" $OUT/fp8.log $OUT/chn.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-70
