# session 41 call c7: c6's FP8 batch-8 step (6.35 ms) against c3's (4.41): FP8 experts weight-only, then W8A8 twice
# (new-fp8 and w8a8-fp8 are the same config now), decode-only as c6, batch 8 / 32
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32 --contexts 512 \
  --variants wonly-fp8,new-fp8,w8a8-fp8 --out $OUT/moe > $OUT/moe.log 2>&1; echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|logits|KV cache" $OUT/moe.log | cut -c1-130
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
