# session 44 c2: the FP8 GEMV with fp16 products and half-chunk sums (fp8_gemv_half) against fp32 FMAs
# 1. its kernel tests on CUDA; 2. ab_fp8_gemv at 1-2 tokens; 3. decode steps at batch 1 / 2, rows twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider tests/kernels/test_fp8_kernels.py \
  -k "gemv or half" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1,2 --only "default,half,half t16k,half r1,half t64k" \
  --out $OUT/gemv > $OUT/gemv.log 2>&1; echo "gemv rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"base": {}, "half": {"fp8_gemv_half": true}, "base2": {}, "half2": {"fp8_gemv_half": true}}'
for k in channel block; do
  timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2 --configs fp8 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1; echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -8
grep -E "^M=|^  [a-z]" $OUT/gemv.log | head -40; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
