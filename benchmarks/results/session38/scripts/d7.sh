# session 38 final call: merged main's CUDA tests (GPU0) | the engine A/B, FP8 + FP8 KV prefill on fa2 / auto (fa3), bf16 (GPU1)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
( CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 timeout 330 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
    tests/model_wrapper/test_moe_fp8_formats.py tests/model_wrapper/test_fp8_pertensor.py tests/model_wrapper/test_online_fp8.py \
    tests/model_wrapper/test_fa3_fp8_prefill_cuda.py tests/model_wrapper/test_fp8_kv_cuda.py tests/model_wrapper/test_fp8_checkpoint.py \
    tests/model_wrapper/test_moe_fp8_shards.py tests/model_wrapper/test_moe.py > $OUT/tests.log 2>&1; echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=4 timeout 330 taskset -c 16-31 python3 .probe/engab.py 2>&1 | grep -v " INFO " > $OUT/engab.log; echo "engab rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; grep -E "FAILED|passed|failed" $OUT/tests.log | cut -c1-220 | tail -15; grep -E "tok/s|COMPILE|prebuilt" $OUT/engab.log | cut -c1-200 | head -20
