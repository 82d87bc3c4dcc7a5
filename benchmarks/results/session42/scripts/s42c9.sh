# session 42 c9 (H100): the same fp8_skinny_mma sweep, and c8's pick (128 rows, 5 stages, 256-column K steps per
# channel) against the default in decode steps, both kinds, rows twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 .probe/mma_sweep.py > $OUT/mma_sweep.log 2>&1; echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"pick": {"fp8_skinny_mma_block_n": 128, "fp8_skinny_mma_stages": 5, "fp8_skinny_mma_row_block_k": 256}, "pick2": {"fp8_skinny_mma_block_n": 128, "fp8_skinny_mma_stages": 5, "fp8_skinny_mma_row_block_k": 256}}'
for k in block channel; do
  timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/step_$k > $OUT/step_$k.log 2>&1; echo "step $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "floor|best" $OUT/mma_sweep.log | cut -c1-300; grep -hE "decode " $OUT/step_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
