# session 45 c1: fp8_skinny_mma's 32-row tiles (Llama-3-8B qkv / o / down at 2-16 tokens) at 1 / 2 / 4 warps
# (fp8_skinny_mma_narrow_warps) and the 64-program floor (64-row tiles: wgmma), per projection; the kernel's CUDA
# tests at 1 / 2 warps; decode rows at 1-16 tokens with 2 warps against the default
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
G='{"fp8_skinny_mma_narrow_warps": [1, 2, 4], "fp8_skinny_mma_min_programs": [64, 128], "fp8_skinny_mma_block_k": [128, 256]}'
timeout 170 taskset -c 0-15 python3 benchmarks/sweep_fp8_skinny_mma.py --kinds block --tokens 2,4,8,16 --per-shape \
  --grid "$G" --out $OUT/sweep_block > $OUT/sweep_block.log 2>&1
echo "sweep block rc=$? $(date +%T)" >> $OUT/rc.txt
G='{"fp8_skinny_mma_narrow_warps": [1, 2, 4], "fp8_skinny_mma_min_programs": [64, 128]}'
timeout 100 taskset -c 0-15 python3 benchmarks/sweep_fp8_skinny_mma.py --kinds channel --tokens 2,4,8,16 --per-shape \
  --grid "$G" --out $OUT/sweep_channel > $OUT/sweep_channel.log 2>&1
echo "sweep channel rc=$? $(date +%T)" >> $OUT/rc.txt
OMP_NUM_THREADS=8 timeout 60 taskset -c 0-15 python3 -m pytest -q -x tests/kernels/test_fp8_kernels.py -k skinny_mma \
  > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
for k in block channel; do
  timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 2,4,8,16 --configs fp8 \
    --fp8-variants '{"w2": {"fp8_skinny_mma_narrow_warps": 2}, "again": {}}' --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/tests.log; grep -hE "best|floor" $OUT/sweep_*.log; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
