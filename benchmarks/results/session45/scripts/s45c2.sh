# session 45 c2: fp8_skinny_mma with K split (fp8_skinny_mma_split_programs) at 64 / 128 rows against the default
# launch, per projection, Llama-3-8B at 2-16 tokens, both formats; the kernel's CUDA tests (split included); decode
# rows at 2-16 tokens under two split launches against the default, the default again
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
G='[{"fp8_skinny_mma_block_n": [128]}, {"fp8_skinny_mma_block_n": [64, 128], "fp8_skinny_mma_min_programs": [1], "fp8_skinny_mma_split_programs": [132, 264, 528]}, {"fp8_skinny_mma_block_n": [32], "fp8_skinny_mma_split_programs": [264, 528]}]'
for k in block channel; do
  timeout 130 taskset -c 0-15 python3 benchmarks/sweep_fp8_skinny_mma.py --kinds $k --tokens 2,4,8,16 --per-shape \
    --grid "$G" --out $OUT/sweep_$k > $OUT/sweep_$k.log 2>&1
  echo "sweep $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 -m pytest -q -x tests/kernels/test_fp8_kernels.py -k skinny_mma \
  > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"s264n64": {"fp8_skinny_mma_block_n": 64, "fp8_skinny_mma_min_programs": 1, "fp8_skinny_mma_split_programs": 264}, "s264n128": {"fp8_skinny_mma_min_programs": 1, "fp8_skinny_mma_split_programs": 264}, "again": {}}'
for k in block channel; do
  timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 2,4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/tests.log; grep -hE "best|floor" $OUT/sweep_*.log; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
