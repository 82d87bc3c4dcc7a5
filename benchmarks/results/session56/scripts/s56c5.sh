# session 56 c5: moe_grid_n_first at prefill (the grouped GEMMs' prefill tiles): Qwen3-30B-A3B prefill 1k / 4k and
# decode batch 1 (the decode path, which the switch does not touch), bf16 and FP8 experts, off / on / off / on
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"nf":{"moe_grid_n_first":true},"again":{},"nf2":{"moe_grid_n_first":true},"nf-fp8":{"moe_grid_n_first":true},"again-fp8":{},"nf2-fp8":{"moe_grid_n_first":true}}'
timeout 420 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|prefill T=" $OUT/moe.log | cut -c1-110
