# session 49 c9 (H200): issue 25's 4k prefill rows on main (Llama-3-8B shape, block FP8 against bf16)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --prefill-only --out $OUT/prefill > $OUT/prefill.log 2>&1
echo "prefill rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -viE "warn|^\s*$" $OUT/prefill.log | tail -n 25 | cut -c1-170
