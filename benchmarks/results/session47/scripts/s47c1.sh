# request for session 47's first device call (one GPU, any card; ~9 min; written in session 46, runs as is on main):
#   cp benchmarks/results/session46/scripts/next_s47c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# Session 46 measured everything on an H200. This call: the two TMA switches written and not yet measured
# (moe_tma_small_weights: the decode batches 8-256 of issue 26 stream the experts' weights through 16-row tiles;
# fp8_skinny_mma_tma: issue 25's 2-16 token FP8 steps) with their tests; issue 26's rows under session 46's defaults;
# the RoPE + store tiles on this card.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "tma or w8a8_cuda" > $OUT/t_moe.log 2>&1
echo "moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new,tma-small,new-fp8,tma-small-fp8,new2-fp8 --out $OUT/moe_tma_small > $OUT/moe_tma_small.log 2>&1
echo "moe tma small rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8,ckpt-fp8 --profile-prefill new --out $OUT/moe_rows > $OUT/moe_rows.log 2>&1
echo "moe rows rc=$? $(date +%T)" >> $OUT/rc.txt
# the e4m3 skinny kernel's weight tiles through TMA (fp8_skinny_mma_tma, written in session 46): its kernel tests, then
# Llama-3-8B decode at 2-16 tokens against the default, both weight formats
timeout 120 taskset -c 0-15 python3 -m pytest -q tests/kernels/test_fp8_kernels.py -k skinny_mma > $OUT/t_skinny.log 2>&1
echo "skinny tests rc=$? $(date +%T)" >> $OUT/rc.txt
for k in block channel; do
  timeout 70 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 2,4,8,16 --configs fp8 \
    --fp8-variants '{"tma": {"fp8_skinny_mma_tma": true}, "again": {}}' --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 60 taskset -c 0-15 python3 benchmarks/ab_rope_store.py --tokens 256,1024,4096 --block-t 1,16:4 --out $OUT/rope > $OUT/rope.log 2>&1
echo "rope rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_moe.log $OUT/t_skinny.log; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=|prefill T=" $OUT/moe_*.log | cut -c1-150
grep -E " us" $OUT/rope.log | cut -c1-90
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
