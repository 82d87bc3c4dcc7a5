# session 57 c4 (session 56's next_s57c1.sh): moe_grid_n_first at the 4k
# prefill by the profiler's GPU time, since the eager 4k wall clock spread 64-117 ms call to call in c1-c5. One profiled
# 4096-token prefill each: the grid off (nf0) / on (the default, new) / off again / on again, bf16 and FP8 experts;
# compare the _moe_gemm_kernel rows of the log's tables
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"nf0":{"moe_grid_n_first":false},"again":{},"nf0b":{"moe_grid_n_first":false},"nf0-fp8":{"moe_grid_n_first":false},"again-fp8":{},"nf0b-fp8":{"moe_grid_n_first":false}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 --variants new,new-fp8 \
  --variants-json "$VM" --profile-prefill new,nf0,again,nf0b,new-fp8,nf0-fp8,again-fp8,nf0b-fp8 --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "prefill T=|GPU time|_moe_gemm_kernel" $OUT/moe.log | cut -c1-120
