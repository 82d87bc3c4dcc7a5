# session 44 c10: fp8_gemv_multi_token_max_weights (new, 12M values: larger weights' 2-token steps on skinny_mma)
# against every 2-token step on the GEMV (before), rows twice: the dense 8B block / per-channel FP8 model and the
# MoE model with block-FP8 attention projections (ckpt-fp8), batch 2 (and 1 / 3 as controls)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
O='"fp8_gemv_multi_token_max_weights": 1099511627776'
for k in block channel; do
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,3 --configs fp8 \
    --fp8-variants "{\"gemv2\": {$O}, \"again\": {}, \"gemv2b\": {$O}}" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2 --contexts 512 \
  --variants ckpt-fp8,ckpt-g2-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-170
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
