# session 53 c8: the MoE FP8 direct GEMVs' warps at 2+ tokens (m2 / m4) with down's act a copy a row (dr)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 python3 -m pytest -q tests/kernels/test_moe_kernel.py -m cuda -k "direct-rows-w4" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"m2-fp8":{"moe_fp8_direct_multi_warps":2},"m2dr-fp8":{"moe_fp8_direct_multi_warps":2,"moe_fp8_direct_down_rows":true},"m4dr-fp8":{"moe_fp8_direct_multi_warps":4,"moe_fp8_direct_down_rows":true},"again-fp8":{},"m2dr2-fp8":{"moe_fp8_direct_multi_warps":2,"moe_fp8_direct_down_rows":true}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,3,4 --contexts 512 \
  --variants new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/t.log; grep -hE "decode B=" $OUT/moe.log | cut -c1-70
