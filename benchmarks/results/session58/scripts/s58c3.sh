# session 58 c3: issues 25 / 26's decode rows on main's defaults, one call (H100 if that is what comes): Llama-3-8B
# bf16 / block FP8 / block FP8 + FP8 KV and per-channel FP8 at batch 1-128; Qwen3-30B-A3B bf16 / FP8 experts at batch
# 1-128 with the batch-1 and -32 kernel profiles; the e4m3 KV decode attention against copy bandwidth
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8,32,128 --configs bf16,fp8,fp8+fp8kv \
  --out $OUT/rows25 > $OUT/rows25.log 2>&1
echo "rows25 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1,8,32,128 --configs fp8 \
  --out $OUT/chn > $OUT/chn.log 2>&1
echo "chn rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --profile new,new-fp8 --out $OUT/rows26 > $OUT/rows26.log 2>&1
echo "rows26 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --out $OUT/kv > $OUT/kv.log 2>&1
echo "kv rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/rows25.log $OUT/chn.log | cut -c1-90
grep -hE "decode B=" $OUT/rows26.log | cut -c1-90; tail -12 $OUT/kv.log | cut -c1-150
