# session 50 c11: 8 warps a program with half the splits where the pairs do not fill the SMs (launch_warps): the
# kernel and model-level tests, the launch against session 50's earlier one, bench_fp8_kv's rows, decode steps
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 python3 -m pytest -m cuda -q tests/kernels/test_e4m3_decode_cuda.py > $OUT/tests.log 2>&1
echo "kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 -m pytest -m cuda -q tests/model_wrapper/test_fp8_kv_cuda.py -k "cuda" > $OUT/model_tests.log 2>&1
echo "model tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 80 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --cases 8x8192,16x8192,32x2048,32x8192,64x2048 \
  --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 80 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/fp8_kv \
  > $OUT/fp8_kv.log 2>&1
echo "fp8_kv rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 140 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 8,16,32 --context 2048 \
  --configs fp8+fp8kv --fp8kv-variants '{"tri": {"fp8_kv_decode_cuda": false}, "again": {}}' --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 1 $OUT/tests.log $OUT/model_tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log $OUT/model_tests.log | head | cut -c1-300
grep -E "^B=" $OUT/ab.log | cut -c1-400; grep -E "float8" $OUT/fp8_kv.log | cut -c90-250; grep -E "^decode" $OUT/fp8.log | cut -c1-150
