# session 54 c5: the decode attention under PDL past batch 2 (decode_attention_pdl_max_batch, 2 since session 33's
# H100 MoE run): o's GEMM then launches during the attention and reads its weights (c4's batch-8 profile: FP8 o
# 9.0 us recorded = exclusive, no overlap). Llama-3-8B bf16 / block FP8 and Qwen3-30B-A3B bf16 / FP8 experts.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"p8":{"decode_attention_pdl_max_batch":8},"p256":{"decode_attention_pdl_max_batch":256},"again":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 4,8,32,128 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"p8":{"decode_attention_pdl_max_batch":8},"p256":{"decode_attention_pdl_max_batch":256},"again":{},"p8-fp8":{"decode_attention_pdl_max_batch":8},"p256-fp8":{"decode_attention_pdl_max_batch":256},"again-fp8":{}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 4,8,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 moe 2>/dev/null; rm -rf $OUT/fp8 $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-75
