# session 55 c9: c8's PDL A/B repeated on another card (FP8 only: Qwen3-30B-A3B experts batch 16 / 32, Llama-3-8B block
# batch 8 / 16, ctx 512), each row twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"pdl64-fp8":{"decode_attention_pdl_max_batch":64},"again-fp8":{},"pdl64b-fp8":{"decode_attention_pdl_max_batch":64}}'
timeout 130 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 16,32 --contexts 512 \
  --variants new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"pdl64":{"decode_attention_pdl_max_batch":64},"again":{},"pdl64b":{"decode_attention_pdl_max_batch":64}}'
timeout 70 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 8,16 --configs fp8 \
  --fp8-variants "$V" --out $OUT/l512 > $OUT/llama512.log 2>&1
echo "llama rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe l512 2>/dev/null; rm -rf $OUT/moe $OUT/l512
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/llama512.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-90
