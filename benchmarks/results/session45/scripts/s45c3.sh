# session 45 c3 (an H100 asked for): the new skinny_mma defaults (rows halved to 64 programs, block weights' K split to
# 132 programs) against session 44's launch, per projection and in decode steps, both formats; the CUDA tests of the
# kernel and of the FP8 checkpoints under the new defaults
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
G='{"fp8_skinny_mma_min_programs": [128, 64], "fp8_skinny_mma_split_programs": [0, 132, 264]}'
for k in block channel; do
  timeout 100 taskset -c 0-15 python3 benchmarks/sweep_fp8_skinny_mma.py --kinds $k --tokens 2,4,8,16 --per-shape \
    --grid "$G" --out $OUT/sweep_$k > $OUT/sweep_$k.log 2>&1
  echo "sweep $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
V='{"s44": {"fp8_skinny_mma_min_programs": 128, "fp8_skinny_mma_split_programs": 0}, "again": {}}'
for k in block channel; do
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
OMP_NUM_THREADS=8 timeout 170 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider tests/kernels/test_fp8_kernels.py \
  -k skinny_mma > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "passed|failed" $OUT/tests.log | tail -2; grep -hE "best|floor" $OUT/sweep_*.log; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
