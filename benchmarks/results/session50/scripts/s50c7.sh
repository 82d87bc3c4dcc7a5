# session 50 c7: issue 25's rows on main with the CUDA e4m3 decode attention (Llama-3-8B block FP8: decode bf16 / FP8 /
# FP8 + FP8 KV at batch 1-128, 4k prefill, the engine FP8 + FP8 KV against bf16), and the launch variants again
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 60 taskset -c 0-15 python3 benchmarks/ab_e4m3_cuda_attention.py --cases 32x2048,64x2048,128x2048,32x8192 --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 480 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --skip-accuracy --batches 1,8,32,128 --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^B=" $OUT/ab.log | cut -c1-400
grep -viE "warn|^\s*$|flashinfer.jit" $OUT/fp8.log | grep -E "^decode|prefill 4096 tokens ms|engine|copy" | cut -c1-330
