# session 44 c12: the FP8 kernel tests on CUDA with this session's defaults (skinny_mma at 2 tokens: its test now at
# 2 / 3 / 8 / 16 tokens), the FP8 checkpoint tests, the MoE FP8 experts' tests at the final FP8 decode bound (32 pairs)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 420 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_fp8_kernels.py \
  tests/model_wrapper/test_fp8_checkpoint.py tests/model_wrapper/test_moe_fp8_formats.py tests/kernels/test_moe_kernel.py \
  -k "fp8" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -12
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
