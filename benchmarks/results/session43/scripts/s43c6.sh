# session 43, c6 (one GPU, any card): issue 25's decode rows under this session's defaults (per-channel skinny_mma up
# to 32 tokens), with the producers quantizing for skinny_mma (fp8_skinny_mma_fused_quant, off by default) beside
# them; the row-wise producers' test fixed in c5's light (it now keeps per-channel skinny_mma at 16 tokens)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_fp8_act.py \
  tests/kernels/test_fp8_kernels.py > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"fq": {"fp8_skinny_mma_fused_quant": true}}'
for k in channel block; do
  timeout 130 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,8,16,32,128 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1; echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -5; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
