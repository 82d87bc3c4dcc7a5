# request for session 43's first device call (one GPU, ~7 min; written in session 42, runs as is on main):
#   cp benchmarks/results/session42/scripts/next_s43c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# 1. the CUDA tests session 42's last defaults did not get to (fp8_skinny_mma at 128 rows / 5 stages / 256-column
#    K steps per channel; the skinny GEMM's tile classes in a model; fast accumulation: run once in c7)
# 2. issue 26's rows with bench_moe's ckpt-fp8 variant (the attention projections in block FP8 too, as the
#    Qwen3-30B-A3B-FP8 checkpoint ships), beside bf16 and FP8 experts
# 3. issue 25's decode rows under the new skinny_mma launch, both formats
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_fp8_kernels.py \
  tests/kernels/test_fp8_act.py tests/kernels/test_gemm.py tests/model_wrapper/test_cuda_model.py -k "skinny or decode_steps or gemv" \
  > $OUT/t_skinny.log 2>&1; echo "t_skinny rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
for k in block channel; do
  timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "passed|failed|FAIL" $OUT/t_skinny.log | tail -6
grep -hE "decode B=|prefill T=|logits" $OUT/bench_moe.log | cut -c1-150; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
