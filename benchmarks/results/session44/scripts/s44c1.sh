# request for session 44's first device call (one GPU, any card, ~6 min; written in session 43, runs as is on main):
#   cp benchmarks/results/session43/scripts/next_s44c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# 1. the checkpoint-level FP8 CUDA tests session 43's c8 did not reach under fp8_skinny_mma_scales_ahead (block
#    bounds eager / graphed, block FP8 experts, the per-channel decode steps), and the decode attention's stage clamp
#    (decode_stages) on the GPU
# 2. issue 25's block decode rows beside per-channel at batch 1-32 under this session's defaults, and the MoE model with
#    block-FP8 attention projections (ckpt-fp8), whose 3-16-token steps run the block skinny_mma
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 300 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/model_wrapper/test_fp8_checkpoint.py \
  tests/kernels/test_fp8_act.py tests/kernels/test_decode_attention.py tests/model_wrapper/test_fp8_kv_cuda.py \
  -k "block or channel or decode or e4m3 or fp8" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
for k in block channel; do
  timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,4,8,16,32 --configs bf16,fp8 \
    --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1; echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32 --contexts 512 \
  --variants new-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -8
grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
