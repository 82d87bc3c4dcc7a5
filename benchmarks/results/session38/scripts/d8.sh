# session 38: the 4k prefill rows on merged main, block FP8 (GPU0) and per-channel FP8 (GPU1), defaults (fast accumulation off)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
mkdir -p $OUT/block $OUT/channel
( CUDA_VISIBLE_DEVICES=0 timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --prefill-only --out $OUT/block > $OUT/block/bench_fp8_prefill.log 2>&1; echo "block rc=$?" >> $OUT/rc.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 200 taskset -c 16-31 python3 benchmarks/bench_fp8.py --kind channel --prefill-only --out $OUT/channel > $OUT/channel/bench_fp8_prefill.log 2>&1; echo "channel rc=$?" >> $OUT/rc.txt ) &
wait; cat $OUT/rc.txt; grep -h "prefill 4096" $OUT/block/bench_fp8_prefill.log $OUT/channel/bench_fp8_prefill.log | cut -c1-200
