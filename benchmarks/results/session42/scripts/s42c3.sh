# session 42 c3: fast accumulation against the FP8 checkpoint test's bounds (seeds x formats); the bf16 skinny GEMM's
# tiles on Qwen3-30B-A3B's attention / router shapes at 8-64 tokens
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 270 taskset -c 0-15 python3 .probe/fa_probe.py > $OUT/fa_probe.log 2>&1; echo "probe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 300 taskset -c 0-15 python3 .probe/skinny_sweep.py > $OUT/skinny_sweep.log 2>&1; echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -5 $OUT/fa_probe.log | cut -c1-300; grep -c within $OUT/fa_probe.log; cat $OUT/skinny_sweep.log | grep -v Warn | tail -30
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
