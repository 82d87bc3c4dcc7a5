# session 45 c4: skinny_mma's weights asked of L2 before its PDL wait (fp8_skinny_mma_prefetch) and its quantize
# kernel under PDL (fp8_quantize_pdl), decode rows at 2-16 tokens against the defaults, both formats; the kernel's CUDA
# tests; Qwen3-30B-A3B with block-FP8 attention (ckpt-fp8) under session 45's skinny_mma launch against session 44's
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"pf": {"fp8_skinny_mma_prefetch": 16384}, "qpdl": {"fp8_quantize_pdl": true}, "both": {"fp8_skinny_mma_prefetch": 16384, "fp8_quantize_pdl": true}, "pf1k": {"fp8_skinny_mma_prefetch": 1024, "fp8_quantize_pdl": true}, "again": {}}'
for k in block channel; do
  timeout 110 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 2,4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
OMP_NUM_THREADS=8 timeout 120 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider tests/kernels/test_fp8_kernels.py \
  -k "skinny_mma and (prefetch or split or default)" > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 4,8,16 --contexts 512 \
  --variants ckpt-s44-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "passed|failed" $OUT/tests.log | tail -2; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
