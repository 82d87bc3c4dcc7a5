# request for a session-43 device call (one GPU, any card, ~5 min):
#   cp benchmarks/results/session42/scripts/next_s43c3.sh .probe/c3.sh; run "bash .probe/c3.sh" carrying .gpu, .probe
# Issue 25's batch-32 / 64 FP8 decode rows (H200, c7: per-channel 5.00 ms = 2.08x its floor, no faster than bf16's 5.12):
# skinny_mma's token tiles of 32 / 64 (fp8_skinny_mma_max_tokens) against cuBLASLt there, now under session 42's
# launch (128 rows, 5 stages, 256-column K steps per channel: -5..-14% a layer at 4-16 tokens). Session 41 measured
# them under the old launch: block 6.2 against 5.1 ms at batch 32 (H200), per-channel even.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"mma32": {"fp8_skinny_mma_max_tokens": 32}, "mma64": {"fp8_skinny_mma_max_tokens": 64}, "again": {}}'
for k in channel block; do
  timeout 140 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 24,32,48,64 --configs fp8 \
    --fp8-variants "$V" --out $OUT/mma_$k > $OUT/mma_$k.log 2>&1; echo "mma $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/mma_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
