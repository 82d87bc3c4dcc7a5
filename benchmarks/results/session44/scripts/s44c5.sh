# session 44 c5: the 16-bit (bf16) cache's decode attention launches by batch (bench_fp8_kv.py --sweep --by-batch
# --kv-dtype bf16, new): LAUNCH["16-bit"] (64 keys, 4 warps, 3 stages: one K / V buffer) against two buffers, 128 keys,
# 8 warps, twice the splits; Llama-3-8B heads (32 / 8) and Qwen3-30B-A3B heads (32 / 4)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
for h in 8 4; do
  timeout 270 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --sweep --by-batch --kv-dtype bf16 --kv-heads $h \
    --out $OUT/kv$h > $OUT/kv$h.log 2>&1; echo "kv$h rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "best at|^B=|failed" $OUT/kv*.log | cut -c1-160; grep -hA6 "FlashInfer: geomean" $OUT/kv*.log | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
