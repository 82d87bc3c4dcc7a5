# session 39 final call: main's CUDA tests (GPU0) | the engine A/B: FP8 + FP8 KV with the Triton prefill's e4m3 math before / now, bf16 (GPU1)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
( CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 timeout ${TT:-330} taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
    tests/kernels/test_fp8_kernels.py tests/kernels/test_prefill_attention.py tests/model_wrapper/test_fp8_checkpoint.py \
    tests/model_wrapper/test_fa3_fp8_prefill_cuda.py tests/model_wrapper/test_fa3_fp8.py tests/model_wrapper/test_fp8_kv_cuda.py \
    tests/model_wrapper/test_fp8_pertensor.py tests/model_wrapper/test_mixed_graph.py tests/model_wrapper/test_online_fp8.py \
    tests/model_wrapper/test_moe_fp8_formats.py > $OUT/tests.log 2>&1; echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=4 timeout ${TE:-330} taskset -c 16-31 python3 .probe/engab39.py 2>&1 | grep -v " INFO " > $OUT/engab.log; echo "engab rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; grep -E "FAILED|ERROR|passed|failed" $OUT/tests.log | cut -c1-220 | tail -15; grep -E "tok/s|COMPILE" $OUT/engab.log | cut -c1-200 | head -20
