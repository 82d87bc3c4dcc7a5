# session 44 c14: the FP8 decode path past 32 pairs with moe_fp8_direct (moe_fp8_decode_pairs 64 / 128 against 32):
# Qwen3-30B-A3B FP8 experts at batch 8 / 16, the default twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 4,8,16 --contexts 512 \
  --variants new-fp8,p64-fp8,p128-fp8,new2-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1
echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-170
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
