# session 50 c8: the engine (FP8 block weights + FP8 KV, Llama-3-8B shape) with the CUDA e4m3 decode attention against
# the Triton kernel, alternated in one process
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 560 taskset -c 0-15 python3 benchmarks/ab_engine_fp8kv.py --out $OUT/eng > $OUT/eng.log 2>&1
echo "eng rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^engine" $OUT/eng.log; grep -iE "error|Traceback" $OUT/eng.log | tail -5
