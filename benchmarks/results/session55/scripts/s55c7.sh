# session 55 c7: where the Qwen3-30B-A3B decode step goes now (bench_moe.py --profile, batch 1 and 32, ctx 512), bf16 and
# FP8 experts, under the new default (decode_attention_fat)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,32 --contexts 512 \
  --variants new,new-fp8 --profile new,new-fp8 --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe.log | cut -c1-90
