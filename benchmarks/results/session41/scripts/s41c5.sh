# session 41 call c5 (an H100, as c4): the Qwen3-30B-A3B benchmark of c3 on this card: bf16 (new), FP8 W8A8 default
# (new-fp8), FP8 weight-only (wonly-fp8), B=1/8/32/128 at ctx 512 + prefill 1k / 4k
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 220 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32,128 --contexts 512 --variants new,new-fp8,wonly-fp8 \
  --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|prefill T=|logits" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
