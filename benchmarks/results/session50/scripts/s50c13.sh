# session 50 c13 (asked for an H200, ran on an H100): bench_fp8_kv rows with the final launch: Llama-3-8B heads (8 KV heads, GQA group 4) and
# Qwen3-30B-A3B heads (4 KV heads, group 8)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/kv8 > $OUT/kv8.log 2>&1
echo "kv8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --kv-heads 4 --batches 8,32,64,128 --contexts 2048,8192 --out $OUT/kv4 > $OUT/kv4.log 2>&1
echo "kv4 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "float8" $OUT/kv8.log $OUT/kv4.log | cut -c1-260
