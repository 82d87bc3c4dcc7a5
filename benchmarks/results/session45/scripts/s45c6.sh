# session 45 c6 (an H100 asked for): the MoE W8A8 grouped GEMMs' small tiles as W a^T (moe_w8a8_swap: wgmma e4m3
# products instead of mma.sync on fp16 conversions), Qwen3-30B-A3B FP8 experts at batch 8-128 against the default
# and the default again; the W8A8 CUDA kernel tests both ways
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,16,32,128 --contexts 512 \
  --variants new-fp8,swap-fp8,new2-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
OMP_NUM_THREADS=8 timeout 110 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider tests/kernels/test_moe_kernel.py \
  -k "w8a8_cuda" > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "PASSED|FAILED|passed|failed" $OUT/tests.log | cut -c1-150 | tail -10; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
