# session 45 c7 (any card; an H200 hoped for): the final skinny_mma defaults against session 44's launch, Llama-3-8B
# decode at 1-16 tokens, both formats
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"s44": {"fp8_skinny_mma_min_programs": 128, "fp8_skinny_mma_split_programs": 0}}'
for k in block channel; do
  timeout 75 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1,2,4,8,16 --configs fp8 \
    --fp8-variants "$V" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
