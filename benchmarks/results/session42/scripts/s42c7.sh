# session 42 c7: the FP8 tests under the new defaults (fast accumulation on, skinny tiles), then issue 25's rows:
# per-channel (accuracy over 512 positions, decode, 4k prefill) and block (decode, 4k prefill)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_fp8_act.py \
  tests/model_wrapper/test_fp8_checkpoint.py -k "act or within_bounds or fp8_experts" > $OUT/t_fp8.log 2>&1; echo "t_fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 250 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --acc-tokens 512 --skip-engine --out $OUT/channel > $OUT/channel.log 2>&1; echo "channel rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --skip-accuracy --skip-engine --out $OUT/block > $OUT/block.log 2>&1; echo "block rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "passed|failed|FAIL" $OUT/t_fp8.log | tail -8
for k in channel block; do echo "== $k"; grep -vE "INFO|WARN|Loading|Warning|^\s*$" $OUT/$k.log | grep -E "B=|prefill|top-1|KL|x bf16|floor|chain" | cut -c1-200 | tail -24; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
