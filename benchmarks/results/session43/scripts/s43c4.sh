# session 43, c4 (one GPU, any card): per-channel skinny_mma up to 32 tokens (fp8_skinny_mma_row_max_tokens, new
# default) and the launch's shared-memory clamp (64 tokens a scale a row failed in c3)
# 1. CUDA tests of the FP8 linears and checkpoints (17-32 per-channel tokens now on skinny_mma)
# 2. A/B of the per-channel bound 16 / 32 (default) / 64 at batch 8-64, Llama-3-8B shape, decode steps, twice
# 3. bench_moe's FP8 variants' logits against bf16 (new): is ckpt-fp8's difference FP8 rounding's scale?
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 220 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_fp8_kernels.py \
  tests/kernels/test_fp8_act.py tests/model_wrapper/test_fp8_checkpoint.py tests/model_wrapper/test_fp8_pertensor.py \
  > $OUT/t_fp8.log 2>&1; echo "t_fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"row16": {"fp8_skinny_mma_row_max_tokens": 16}, "row64": {"fp8_skinny_mma_row_max_tokens": 64}, "again": {}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 8,16,24,32,48,64 \
  --configs fp8 --fp8-variants "$V" --out $OUT/row > $OUT/row.log 2>&1; echo "row rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8 --contexts 512 \
  --variants new,new-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "passed|failed|FAIL|Error" $OUT/t_fp8.log | tail -8
grep -hE "^decode " $OUT/row.log; grep -hE "decode B=|logits" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
