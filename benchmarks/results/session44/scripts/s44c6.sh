# session 44 c6: FP8 experts kept e4m3 in the MoE decode GEMVs' registers (moe_fp8_direct, new): its kernel tests on
# CUDA, then bench_moe.py's FP8 rows at batch 1 / 2 with it (and the decode path up to 16 pairs) (tiles 32k / 16k / gate_up 32k + down 16k) against the
# default (dequantized 8k tiles), the default twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_moe_kernel.py \
  -k "direct or packed" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 330 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2 --contexts 512 \
  --variants new-fp8,direct-fp8,direct16-fp8,direct-d16-fp8,direct-p16-fp8,new2-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -8
grep -hE "decode B=|logit|diff" $OUT/bench_moe.log | cut -c1-170 | head -30
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
