# session 44 c9: (1) the dense FP8 linears' 2-token steps on skinny_mma instead of the FP8 GEMV (fp8_gemv_max_tokens 1
# against 2; bench_fp8.py at batch 2 / 3, rows twice), (2) issue 26's rows with this session's defaults
# (moe_fp8_direct, 16k tiles, FP8 decode path up to 32 pairs), with the block-FP8 attention projections' variant
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
G='"fp8_gemv_max_tokens": 1'
for k in channel block; do
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,3 --configs fp8 \
    --fp8-variants "{\"g1\": {$G}, \"base2\": {}, \"g1b\": {$G}}" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4,8,32,128 --contexts 512 \
  --variants new,new-fp8,ckpt-fp8,ckpt-g1-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-170
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
