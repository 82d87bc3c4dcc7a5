# session 49 c6 (H200): issue 25's decode rows and the e4m3 KV attention's fraction of copy bandwidth on main's defaults
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 1,8,32,128 \
  --configs bf16,fp8,fp8+fp8kv --out $OUT/fp8_block > $OUT/fp8_block.log 2>&1
echo "bench_fp8 block rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/fp8_kv \
  > $OUT/fp8_kv.log 2>&1
echo "bench_fp8_kv rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hiE "B=|x[0-9]|frac|copy" $OUT/fp8_block.log $OUT/fp8_kv.log | cut -c1-160 | tail -n 40
