# session 50 c3: FP8 weights + FP8 KV decode steps (Llama-3-8B block FP8, context 2048), the CUDA e4m3 attention
# (default from batch 3) against the Triton kernel everywhere (tri) and the CUDA kernel at batch 1-2 too (cuda-all)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 400 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 1,2,8,32,128 --context 2048 \
  --configs fp8+fp8kv --fp8kv-variants '{"tri": {"fp8_kv_decode_cuda": false}, "cuda-all": {"decode_attention_pdl_max_batch": 0}, "again": {}}' \
  --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^decode" $OUT/fp8.log | cut -c1-150
