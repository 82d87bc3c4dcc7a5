# session 51 c1: where the Qwen3-30B-A3B decode step at batch 8-128 loses its time on this tree
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --kv-heads 4 --batches 8,32,128 --contexts 512,2048 --out $OUT/kv4 > $OUT/kv4.log 2>&1
echo "kv4 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --sweep --kv-dtype bf16 --kv-heads 4 --cases 8x512,32x512,128x512,32x2048 \
  --variants '[{"block_n":64,"num_warps":4,"num_stages":3},{"block_n":64,"num_warps":4,"num_stages":5},{"block_n":32,"num_warps":4,"num_stages":3},{"block_n":32,"num_warps":2,"num_stages":5},{"block_n":128,"num_warps":4,"num_stages":3},{"block_n":128,"num_warps":8,"num_stages":3},{"block_n":64,"num_warps":4,"num_stages":3,"split_factor":2},{"block_n":64,"num_warps":4,"num_stages":3,"split_factor":0.5},{"block_n":32,"num_warps":4,"num_stages":5,"split_factor":2},{"block_n":16,"num_warps":4,"num_stages":5,"split_factor":2}]' \
  --out $OUT/kvs > $OUT/kvs.log 2>&1
echo "kvs rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 330 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json '{"a32":{"moe_align_chunk":32},"a64":{"moe_align_chunk":64},"a32-fp8":{"moe_align_chunk":32},"a16-fp8":{"moe_align_chunk":16},"a64-fp8":{"moe_align_chunk":64}}' \
  --profile new-fp8,new --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "B=" $OUT/kv4.log | cut -c1-230; grep -vE "^\s*$" $OUT/kvs.log | tail -n 45 | cut -c1-200
grep -hE "decode B=" $OUT/moe.log | cut -c1-150
