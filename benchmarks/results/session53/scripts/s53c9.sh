# session 53 c9 (H100): the MoE FP8 direct GEMVs at 2 warps from 2 tokens (m2), and down's act a copy a row (dr)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"m2-fp8":{"moe_fp8_direct_multi_warps":2},"dr-fp8":{"moe_fp8_direct_down_rows":true},"again-fp8":{},"m2b-fp8":{"moe_fp8_direct_multi_warps":2}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,3,4 --contexts 512 \
  --variants new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe.log | cut -c1-70
