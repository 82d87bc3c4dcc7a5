# session 51 c2: the 16-bit decode attention's splits rounded down (decode_splits_floor) and the align chunk, kernel and steps
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='[{"block_n":64,"num_warps":4,"num_stages":3},{"block_n":64,"num_warps":4,"num_stages":3,"split_factor":0.5},{"block_n":32,"num_warps":4,"num_stages":3},{"block_n":32,"num_warps":4,"num_stages":3,"split_factor":0.5}]'
for h in 4 8; do
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --sweep --kv-dtype bf16 --kv-heads $h --cases 1x2048,2x2048,4x512,4x2048,8x512,8x2048,8x8192,16x512,16x2048,16x8192,32x512,32x2048,32x8192 \
  --variants "$V" --out $OUT/kvs$h > $OUT/kvs$h.log 2>&1
echo "kvs$h rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,16,32 --contexts 512,2048 \
  --variants new,new-fp8,new2,new2-fp8 --variants-json '{"sf":{"decode_splits_floor":true},"a16":{"moe_align_chunk":16},"sf-fp8":{"decode_splits_floor":true},"a16-fp8":{"moe_align_chunk":16},"a32-fp8":{"moe_align_chunk":32}}' \
  --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --skip-accuracy --configs bf16,fp8 --batches 4,8,16,32 --context 2048 \
  --bf16-variants '{"sf":{"decode_splits_floor":true},"again":{}}' --fp8-variants '{"sf":{"decode_splits_floor":true},"again":{}}' --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; for h in 4 8; do grep -E "^B=|   \{" $OUT/kvs$h.log | cut -c1-110; done
grep -hE "decode B=" $OUT/moe.log | cut -c1-100; grep -E "ms|x" $OUT/fp8.log | grep -iE "decode|batch" | cut -c1-160 | head -40
