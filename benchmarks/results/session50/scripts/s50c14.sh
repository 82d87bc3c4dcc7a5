# session 50 c14: after the review's refactor (one scale check, e4m3_decode_cuda.fills): the CUDA kernel's tests, the
# model-level FP8 KV tests, the Triton decode attention's
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 300 python3 -m pytest -m cuda -q tests/kernels/test_e4m3_decode_cuda.py tests/kernels/test_decode_attention.py \
  tests/model_wrapper/test_fp8_kv_cuda.py -k "cuda or decode" > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head | cut -c1-300
