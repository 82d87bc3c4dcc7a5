# session 50 c10: the CUDA e4m3 decode attention at batch 4-64: 8 warps a program with half (a quarter) the splits
# against 4 warps (the same warps a SM, fewer or no split merges)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --cases 4x8192,8x8192,16x8192,32x2048,32x8192,64x2048 \
  --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^B=" $OUT/ab.log | cut -c1-500
