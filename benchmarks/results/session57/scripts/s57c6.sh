# session 57 c6: the Qwen3-30B-A3B 4k prefill's host calls with stacks and the GPU's idle stretches (c5 found 25 ms of
# host aten::index in a 66-74 ms call whose kernels take 59)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 300 taskset -c 0-15 python3 benchmarks/results/session57/scripts/s57c6_prefill_stacks.py > $OUT/stacks.log 2>&1
echo "stacks rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -v "UserWarning\|_warn_once" $OUT/stacks.log | cut -c1-160 | head -120
