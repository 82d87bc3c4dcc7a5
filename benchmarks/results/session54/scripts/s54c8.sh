# session 54 c8 (H100): fp8_gemv_x_once (on since c4, measured on H200s only) against off; issue 25 / 26 rows there
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"xoff":{"fp8_gemv_x_once":false},"again":{}}'
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/chn > $OUT/chn.log 2>&1
echo "chn rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"ckpt-xoff-fp8":{"fp8_gemv_x_once":false},"ckpt-again-fp8":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1 --contexts 512 \
  --variants ckpt-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8,32,128 --configs bf16,fp8 \
  --out $OUT/rows25 > $OUT/rows25.log 2>&1
echo "rows25 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --out $OUT/rows26 > $OUT/rows26.log 2>&1
echo "rows26 rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 chn moe rows25 rows26 2>/dev/null; rm -rf $OUT/fp8 $OUT/chn $OUT/moe $OUT/rows25 $OUT/rows26
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log $OUT/chn.log $OUT/rows25.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log $OUT/rows26.log | cut -c1-75
