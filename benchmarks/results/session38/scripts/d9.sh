# session 38: the refactored CUDA tests on main (one GPU)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
timeout 280 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/model_wrapper/test_fa3_fp8_prefill_cuda.py \
  tests/model_wrapper/test_fp8_kv_cuda.py tests/model_wrapper/test_fp8_checkpoint.py tests/model_wrapper/test_fp8_pertensor.py > $OUT/tests.log 2>&1
echo "rc=$?"; grep -E "FAILED|passed|failed" $OUT/tests.log | cut -c1-200 | tail -12
