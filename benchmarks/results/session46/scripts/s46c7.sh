# session 46 c7: the grouped GEMMs' prefill weight tiles through TMA descriptors (moe_tma_weights): CUDA tests, then
# Qwen3-30B-A3B prefill A/B (bf16 and FP8 experts) with profiled GPU time at 4k
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "sorted-tma or w8a8_cuda" > $OUT/t_moe.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 \
  --variants new,tma,new-fp8,tma-fp8 --profile-prefill new,tma,new-fp8,tma-fp8 --out $OUT/moe_tma > $OUT/moe_tma.log 2>&1
echo "moe tma rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 3 $OUT/t_moe.log
grep -E "prefill T=|GPU time by|_moe_gemm" $OUT/moe_tma.log | cut -c1-140
