# session 47 c4 (H200): a scale a row's skinny_mma weight tiles through TMA as 128-column boxes (two a 256-column K
# step, each as wide as the swizzle; c1-c3's one 256-column box lost 1-4%): its kernel tests, then Llama-3-8B
# per-channel decode at 2-32 tokens, off / on / off again / on again
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 taskset -c 0-15 python3 -m pytest -q tests/kernels/test_fp8_kernels.py -k skinny_mma > $OUT/t_skinny.log 2>&1
echo "skinny tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 2,4,8,16,32 --configs fp8 \
  --fp8-variants '{"rtma": {"fp8_skinny_mma_row_tma": true}, "again": {}, "rtma2": {"fp8_skinny_mma_row_tma": true}}' \
  --out $OUT/fp8_channel > $OUT/fp8_channel.log 2>&1
echo "fp8 channel rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_skinny.log; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
