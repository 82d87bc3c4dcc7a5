# session 48 c4 (H200): the W8A8 small tiles' launch under the swap + TMA (session 47's defaults): sweep_moe's
# grouped-GEMM tiles on FP8 experts W8A8 at 8 / 32 / 128 tokens (fused_moe alone), then bench_moe's decode rows
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/sweep_moe.py --prefill-only --prefill-kinds w8a8 --prefill-tokens 8,32,128 \
  --prefill-tiles '[[16,64,128,4,3],[16,64,128,4,4],[16,64,128,4,5],[16,64,128,4,6],[16,128,128,4,3],[16,128,128,4,4],[16,128,128,8,3],[16,64,128,4,2],[32,64,128,4,4],[16,64,128,8,4]]' \
  --out $OUT/sweep/moe_sweep.json > $OUT/sweep.log 2>&1
echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new-fp8,s4-fp8,s5-fp8,n128-fp8,n128s4-fp8,new2-fp8 --out $OUT/moe_tiles > $OUT/moe_tiles.log 2>&1
echo "moe tiles rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^T=" $OUT/sweep.log | cut -c1-130; tail -3 $OUT/sweep.log | cut -c1-200
grep -hE "decode B=" $OUT/moe_tiles.log | cut -c1-150
