# request for session 46's first device call (one GPU, any card; ~7 min; written in session 45, runs as is on main):
#   cp benchmarks/results/session45/scripts/next_s46c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# Session 44 kept the FP8 GEMV for 2-token steps of weights up to 12M values because skinny_mma then cost
# Qwen3-30B-A3B's small block-FP8 attention projections 3.01 -> 3.68 ms at batch 2; session 45 changed skinny_mma's
# launch for such shapes (64-row wgmma tiles, K split: o in 5 parts). Whether the bound still pays (ckpt-g1-fp8: every
# 2-token step on skinny_mma), issue 26's rows under session 45's defaults, the norms quantizing for skinny_mma, and
# what each projection's quantize kernel costs (sweep --prequantized).
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,3 --contexts 512 \
  --variants ckpt-fp8,ckpt-g1-fp8 --out $OUT/moe_g1 > $OUT/moe_g1.log 2>&1
echo "moe g1 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8,ckpt-fp8 --out $OUT/moe_rows > $OUT/moe_rows.log 2>&1
echo "moe rows rc=$? $(date +%T)" >> $OUT/rc.txt
# the add + RMSNorm quantizing x for skinny_mma (fp8_skinny_mma_fused_quant: one quantize kernel fewer before qkv and
# gate_up; even under session 40's launch, when each projection's K loop took longer)
for k in block channel; do
  timeout 70 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 2,4,8,16 --configs fp8 \
    --fp8-variants '{"fq": {"fp8_skinny_mma_fused_quant": true}, "again": {}}' --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
# what the quantize kernels cost each projection: the default launch per projection with x quantized beforehand
for q in "" "--prequantized"; do
  timeout 45 taskset -c 0-15 python3 benchmarks/sweep_fp8_skinny_mma.py --tokens 2,8,16 --per-shape $q \
    --grid '{"fp8_skinny_mma_min_programs": [64]}' --out $OUT/sweep$q > $OUT/sweep$q.log 2>&1
  echo "sweep $q rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "M=|best" $OUT/sweep*.log; grep -hE "decode B=|prefill" $OUT/moe_*.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
