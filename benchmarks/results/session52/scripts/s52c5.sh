# session 52 c5: batch 1 and 2 kernel by kernel (bf16, block FP8); the 2-token step on the GEMVs against the next path
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/profile_dense_decode.py --batches 1,2 --models bf16,fp8 --out $OUT/prof > $OUT/prof.log 2>&1
echo "prof rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"g1":{"gemv_max_tokens":1,"fp8_gemv_max_tokens":1},"t8k":{"gemv_tile":8192},"t32k":{"gemv_tile":32768},"again":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2,3 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -v "INFO\|Warn\|warn" $OUT/prof.log | head -70; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
cd $OUT && tar cJf c5.tar.xz prof fp8 prof.log fp8.log && rm -rf fp8 prof
