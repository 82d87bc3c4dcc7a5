# session 50 c5: the CUDA e4m3 decode attention with K / V through cp.async stages (shared memory): its tests, the
# launch variants, bench_fp8_kv's rows, and FP8 + FP8 KV decode steps with the attention under PDL at every batch
source .gpu/device-setup.sh > $OUT/setup.log 2>&1

nvidia-smi -L > $OUT/gpus.txt
timeout 150 python3 -m pytest -m cuda -q tests/kernels/test_e4m3_decode_cuda.py > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/fp8_kv \
  > $OUT/fp8_kv.log 2>&1
echo "fp8_kv rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 8,32,128 --context 2048 \
  --configs fp8+fp8kv --fp8kv-variants '{"pdl-all": {"decode_attention_pdl_max_batch": 1024}, "again": {}}' \
  --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 3 $OUT/tests.log; grep -E "FAIL|Error" $OUT/tests.log | head -10 | cut -c1-300
grep -E "^B=" $OUT/ab.log | cut -c1-400; grep -E "float8" $OUT/fp8_kv.log | cut -c1-250; grep -E "^decode" $OUT/fp8.log | cut -c1-150
