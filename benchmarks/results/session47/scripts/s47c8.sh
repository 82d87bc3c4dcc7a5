# session 47 c8 (H200): the swapped W8A8 small tiles' error against the float64 oracle at 3 / 16 / 32 tokens (Qwen3-30B-A3B
# layer shape), beside the default's; the decode A/B once more at batch 32 / 128
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 60 taskset -c 0-15 python3 benchmarks/results/session47/scripts/s47c8_errs.py (as .probe/errs.py) > $OUT/errs.log 2>&1
echo "errs rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 32,128 --contexts 512 \
  --variants new-fp8,swap-tma-fp8,new2-fp8 --out $OUT/moe_swap2 > $OUT/moe_swap2.log 2>&1
echo "moe swap2 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 12 $OUT/errs.log; grep -hE "decode B=" $OUT/moe_swap2.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
