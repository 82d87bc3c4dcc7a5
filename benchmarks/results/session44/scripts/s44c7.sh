# session 44 c7: moe_fp8_direct as the default (16k tiles, decode path up to 16 FP8 pairs): the MoE FP8 CUDA tests
# (kernels, checkpoints, compressed-tensors experts, shards), then bench_moe.py's FP8 rows at batch 1 / 2 / 4 / 8:
# the default against session 43's (dequant-fp8), 32k tiles, the decode path up to 32 pairs, the shipped layout
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 290 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_moe_kernel.py \
  tests/model_wrapper/test_moe_fp8_formats.py tests/model_wrapper/test_moe_fp8_shards.py tests/model_wrapper/test_fp8_checkpoint.py \
  -k "fp8 or moe" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 270 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4,8 --contexts 512 \
  --variants dequant-fp8,new-fp8,direct32-fp8,p32-fp8,new2-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -12
grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-170 | head -30
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
