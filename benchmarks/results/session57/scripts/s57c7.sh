# session 57 c7: torch's CPU threads and the 4k prefill's host time (c5 / c6)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 300 taskset -c 0-15 python3 benchmarks/results/session57/scripts/s57c7_host_threads.py > $OUT/threads.log 2>&1
echo "threads rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; cut -c1-400 $OUT/threads.log | grep -v Warning
