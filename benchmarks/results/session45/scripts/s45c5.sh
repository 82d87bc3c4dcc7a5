# session 45 c5: the final skinny_mma defaults (K split for block weights, rows not halved below 64 where K splits):
# the FP8 CUDA tests (kernel, activations, checkpoints eager and graphed); Qwen3-30B-A3B with block-FP8 attention
# against session 44's launch and against 32-row tiles; Llama-3-8B decode rows at 1-16 tokens, both formats
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 100 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider tests/kernels/test_fp8_kernels.py \
  tests/kernels/test_fp8_act.py -k "skinny_mma or quantiz" > $OUT/tests_k.log 2>&1
echo "kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
T="tests/model_wrapper/test_fp8_checkpoint.py tests/model_wrapper/test_fp8_pertensor.py"
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda $T > $OUT/tests.log 2>&1
echo "model tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 2,4,8,16 --contexts 512 \
  --variants ckpt-s44-fp8,ckpt-r32-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"s44": {"fp8_skinny_mma_min_programs": 128, "fp8_skinny_mma_split_programs": 0}}'
for k in block channel; do
  timeout 80 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "passed|failed" $OUT/tests*.log | tail -3; grep -hE "FAILED|ERROR" $OUT/tests*.log | head; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
