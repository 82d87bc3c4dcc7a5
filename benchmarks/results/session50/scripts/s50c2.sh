# session 50 c2: the CUDA e4m3 decode kernel wired in (KernelConfig.fp8_kv_decode_cuda): its GPU tests and the
# model-level FP8 KV tests, the launch variants against Triton, bench_fp8_kv's rows (the issue's)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
pip install -q --no-deps .probe/*.whl > /dev/null 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 240 python3 -m pytest -m cuda -q -n 8 tests/kernels/test_e4m3_decode_cuda.py tests/model_wrapper/test_fp8_kv_cuda.py \
  > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 1,8,32,64,128 --contexts 2048,8192 --out $OUT/fp8_kv \
  > $OUT/fp8_kv.log 2>&1
echo "fp8_kv rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 4 $OUT/tests.log; grep -E "FAIL|Error" $OUT/tests.log | head -10 | cut -c1-300
grep -E "^B=" $OUT/ab.log | cut -c1-330; grep -E "float8" $OUT/fp8_kv.log | cut -c1-250
