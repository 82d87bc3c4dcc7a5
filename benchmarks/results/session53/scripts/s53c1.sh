# for session 53's first call (H100 or H200): fp8_attention_out_quant (off by default) — its CUDA tests, then an A/B
# of the block-FP8 decode steps that run o on skinny_mma, dense and Qwen3-30B-A3B with block-FP8 attention projections
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 python3 -m pytest -m cuda -q tests/kernels/test_decode_attention.py tests/model_wrapper/test_fp8_checkpoint.py \
  -k "merge_quantizes or attention_merge or (keeps_fp8 and block)" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"on":{"fp8_attention_out_quant":true},"again":{}}'
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 2,4,8,16,32 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"ckpt-on-fp8":{"fp8_attention_out_quant":true},"ckpt-again-fp8":{}}'
timeout 180 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 4,8,32 --contexts 512 \
  --variants ckpt-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "passed|failed" $OUT/t.log | tail -3; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-75
