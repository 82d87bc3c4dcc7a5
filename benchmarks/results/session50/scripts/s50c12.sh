# session 50 c12 (asked for an H200, ran on the held H100): the final launch again: 8 warps a program with half the splits where the pairs do not fill the SMs (launch_warps): the
# kernel and model-level tests, the launch against session 50's earlier one, bench_fp8_kv's rows, decode steps
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 80 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --cases 8x8192,16x8192,32x2048,32x8192,64x2048 \
  --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 80 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/fp8_kv \
  > $OUT/fp8_kv.log 2>&1
echo "fp8_kv rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 140 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 1,8,32,128 --context 2048 \
  --configs fp8+fp8kv --fp8kv-variants '{"tri": {"fp8_kv_decode_cuda": false}, "again": {}}' --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
grep -E "^B=" $OUT/ab.log | cut -c1-400; grep -E "float8" $OUT/fp8_kv.log | cut -c90-250; grep -E "^decode" $OUT/fp8.log | cut -c1-150
