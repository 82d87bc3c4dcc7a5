# session 50 c4: the CUDA e4m3 decode attention under PDL (cuLaunchKernelEx): its tests, the launch variants, and
# FP8 + FP8 KV decode steps (Llama-3-8B block FP8, context 2048): default (CUDA from batch 3, Triton under PDL at 1-2),
# cuda-all (CUDA at every batch, under PDL at 1-2), tri (the Triton kernel everywhere), the default again
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
pip install -q --no-deps .probe/*.whl > /dev/null 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 python3 -m pytest -m cuda -q -n 8 tests/kernels/test_e4m3_decode_cuda.py tests/model_wrapper/test_fp8_kv_cuda.py \
  > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 1,2,8,32,128 --context 2048 \
  --configs fp8+fp8kv --fp8kv-variants '{"cuda-all": {"fp8_kv_decode_cuda_min_batch": 1}, "tri": {"fp8_kv_decode_cuda": false}, "again": {}}' \
  --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 3 $OUT/tests.log; grep -E "FAIL|Error" $OUT/tests.log | head -10 | cut -c1-300
grep -E "^B=" $OUT/ab.log | cut -c1-330; grep -E "^decode" $OUT/fp8.log | cut -c1-150
