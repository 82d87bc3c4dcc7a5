# session 47 c6 (H100): block FP8 at 17-64 tokens on the e4m3 skinny kernel, now with its TMA weight tiles, against
# cuBLASLt (the default past fp8_skinny_mma_max_tokens = 16; session 41: 6.2 against 5.1 ms at batch 32 with pointer
# loads)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 16,24,32,48 --configs fp8 \
  --fp8-variants '{"m32": {"fp8_skinny_mma_max_tokens": 32}, "again": {}}' \
  --out $OUT/fp8_block > $OUT/fp8_block.log 2>&1
echo "fp8 block rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
