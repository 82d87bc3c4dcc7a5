# session 55 c5: c4's Qwen3-30B-A3B half at ctx 512 only (c4's run stopped at the batch-128 x 2048 cache, which did not
# fit the 80 GB card): issue 26 rows with decode_attention_fat on (default) / off / on again
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"nofat":{"decode_attention_fat":false},"again":{},"nofat-fp8":{"decode_attention_fat":false},"again-fp8":{}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,16,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe.log | cut -c1-90
