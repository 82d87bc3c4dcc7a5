# request for session 45's first device call (one GPU, any card; ~6 min; written in session 44, runs as is on main):
#   cp benchmarks/results/session44/scripts/next_s45c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# Session 44 saw the two FP8 formats' 2-3 token steps swap places by card: at batch 3 block skinny_mma 3.62 ms against
# per-channel's 4.48 on an H200 (c9 / c10), per-channel 4.25 against block's 4.97 on an H100 (c11). The skinny_mma
# launch sweep at 2-8 tokens on whichever card comes (its defaults were swept at 4-16), then the decode rows at 2-4.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 300 taskset -c 0-15 python3 benchmarks/sweep_fp8_skinny_mma.py --tokens 2,3,4,8 --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
for k in channel block; do
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,3,4 --configs bf16,fp8 \
    --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1; echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -iE "best|layer" $OUT/sweep.log | tail -12; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
