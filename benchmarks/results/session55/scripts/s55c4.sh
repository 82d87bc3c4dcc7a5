# session 55 c4 (H200): decode_attention_fat's launch against others with one program a SM (kernel alone, Qwen3-30B-A3B
# and Llama-3-8B heads); decode steps with it on (default) / off; issue 25 / 26 rows
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='[{"block_n": 64, "num_warps": 4, "num_stages": 3}, {"block_n": 128, "num_warps": 4, "num_stages": 5, "split_factor": 0.25}, {"block_n": 128, "num_warps": 8, "num_stages": 5, "split_factor": 0.25}, {"block_n": 64, "num_warps": 4, "num_stages": 7, "split_factor": 0.25}, {"block_n": 64, "num_warps": 8, "num_stages": 7, "split_factor": 0.25}, {"block_n": 256, "num_warps": 4, "num_stages": 3, "split_factor": 0.25}, {"block_n": 256, "num_warps": 8, "num_stages": 3, "split_factor": 0.25}, {"block_n": 128, "num_warps": 4, "num_stages": 7, "split_factor": 0.25}, {"block_n": 256, "num_warps": 8, "num_stages": 5, "split_factor": 0.25}]'
timeout 150 python3 benchmarks/bench_fp8_kv.py --sweep --kv-dtype bf16 --kv-heads 4 --cases 32x512,32x2048,16x512,16x2048 --variants "$V" --out $OUT/sw4 > $OUT/sweep4.log 2>&1
echo "sw4 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 benchmarks/bench_fp8_kv.py --sweep --kv-dtype bf16 --kv-heads 8 --cases 16x512,16x2048,8x2048 --variants "$V" --out $OUT/sw8 > $OUT/sweep8.log 2>&1
echo "sw8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"nofat":{"decode_attention_fat":false},"again":{},"nofat-fp8":{"decode_attention_fat":false},"again-fp8":{}}'
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,16,32,128 --contexts 512,2048 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
V2='{"nofat":{"decode_attention_fat":false},"again":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8,16,32,128 --configs bf16,fp8 \
  --bf16-variants "$V2" --fp8-variants "$V2" --out $OUT/l512 > $OUT/llama512.log 2>&1
echo "llama rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT sw4 sw8 moe l512 2>/dev/null; rm -rf $OUT/sw4 $OUT/sw8 $OUT/moe $OUT/l512
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/llama512.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-90
