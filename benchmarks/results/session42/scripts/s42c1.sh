# request for session 42's first device call (one GPU, ~8 min; written in session 41, runs as is on main):
#   cp benchmarks/results/session41/scripts/next_s42c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# 1. the MoE kernel tests with KernelConfig.moe_w8a8_lag (the W8A8 small tiles' products scaled a K step late)
# 2. one MoE layer at 2-128 tokens: W8A8 default against lag-fp8 and weight-only (sweep_moe switches)
# 3. the W8A8 small tiles with deeper pipelines (sweep_moe --prefill-only, 32-256 tokens), lag beside
# 4. Qwen3-30B-A3B: the first rows over fill_kv's random cache (bf16, FP8 W8A8, lag, weight-only), B=1/8/32/128,
#    prefill 1k / 4k: issue 26's rows on this card
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 120 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_moe_kernel.py \
  -k w8a8 > $OUT/t_moe_w8a8.log 2>&1; echo "t_moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 90 taskset -c 0-15 python3 benchmarks/sweep_moe.py --switches --only lag-fp8,wonly-fp8 --tokens 2,4,8,16,32,128 \
  --out $OUT/switches.json > $OUT/switches.log 2>&1; echo "switches rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 90 taskset -c 0-15 python3 benchmarks/sweep_moe.py --prefill-only --prefill-kinds w8a8,w8a8-lag --prefill-tokens 32,64,128,256 \
  --out $OUT/small_tiles.json > $OUT/small_tiles.log 2>&1; echo "tiles rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 220 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8,lag-fp8,wonly-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -1 $OUT/t_moe_w8a8.log; grep -E "^T=" $OUT/switches.log | cut -c1-100
grep -E "^T=" $OUT/small_tiles.log | cut -c1-110; grep -hE "decode B=|prefill T=|logits" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
