# session 42 c8: fp8_skinny_mma's launch swept at 4-16 tokens (Llama-3-8B, block and per-channel), then the best
# of each kind against the default in decode steps (bench_fp8.py --decode-only, batches 4 / 8 / 16, rows twice)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 240 taskset -c 0-15 python3 .probe/mma_sweep.py > $OUT/mma_sweep.log 2>&1; echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
for k in block channel; do
  V=$(python3 -c "import json,sys; v=json.load(open('$OUT/mma_sweep.json'))['$k']['variant']; print(json.dumps({'best': v, 'best2': v}))" 2>/dev/null)
  [ -n "$V" ] && timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/step_$k > $OUT/step_$k.log 2>&1; echo "step $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "floor|best" $OUT/mma_sweep.log | cut -c1-300; grep -hE "decode " $OUT/step_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
