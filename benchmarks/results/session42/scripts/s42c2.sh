# session 42 c2: fast accumulation against the FP8 checkpoint test's bounds (the cause of session 35's failure),
# the per-channel 4k prefill with it, and where an FP8-experts decode step goes at batch 1 and 32 (profile)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 .probe/fa_probe.py > $OUT/fa_probe.log 2>&1; echo "probe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --prefill-only --skip-accuracy --skip-engine \
  --prefill-variants '{"fast": {"fp8_fast_accum": true}}' --out $OUT/fp8ch > $OUT/fp8ch.log 2>&1; echo "fp8ch rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_moe.py --decode-only --no-peer --batches 1,32 --contexts 512 \
  --variants new,new-fp8 --profile new,new-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; cut -c1-400 $OUT/fa_probe.log | tail -40; grep -iE "prefill|x bf16|ms" $OUT/fp8ch.log | tail -20
grep -hE "decode B=|logits" $OUT/bench_moe.log | cut -c1-150; sed -n '/^---/,$p' $OUT/bench_moe.log | head -80
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
