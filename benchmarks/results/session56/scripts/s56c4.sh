# session 56 c4: moe_grid_n_first (the grouped GEMMs' programs numbered column block first) against the default grid:
# Qwen3-30B-A3B decode at batch 8 / 32 / 128 (ctx 512), bf16 and FP8 experts, off / on / off again / on again (FP8)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"nf":{"moe_grid_n_first":true},"again":{},"nf-fp8":{"moe_grid_n_first":true},"again-fp8":{},"nf2-fp8":{"moe_grid_n_first":true}}'
timeout 400 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|logit" $OUT/moe.log | cut -c1-110
