# session 44 c11 (an H100, named): c10's A/B of fp8_gemv_multi_token_max_weights, and the MoE FP8 defaults of this
# session (moe_fp8_direct, 16k tiles, FP8 decode path up to 32 pairs) against session 43's (dequant-fp8) and 16 pairs
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
O='"fp8_gemv_multi_token_max_weights": 1099511627776'
for k in block channel; do
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,3 --configs fp8 \
    --fp8-variants "{\"gemv2\": {$O}, \"again\": {}, \"gemv2b\": {$O}}" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 250 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4,8 --contexts 512 \
  --variants dequant-fp8,new-fp8,p16-fp8,new2-fp8,ckpt-fp8,ckpt-g2-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-170
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
