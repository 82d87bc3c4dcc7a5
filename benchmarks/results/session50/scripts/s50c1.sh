# session 50 c1: the e4m3 decode attention in CUDA (NVRTC) against the Triton kernel: accuracy and speed
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 400 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -vi "warn" $OUT/ab.log | cut -c1-400 | tail -n 30
