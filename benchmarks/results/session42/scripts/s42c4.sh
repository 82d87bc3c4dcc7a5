# session 42 c4: the skinny GEMM's new tile classes (CUDA test, sweep, decode-step A/B against the previous rule);
# fast accumulation against the FP8 checkpoint test's bounds
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 90 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_gemm.py > $OUT/t_gemm.log 2>&1; echo "t_gemm rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 330 taskset -c 0-15 python3 benchmarks/ab_skinny_tiles.py --sweep --steps --out $OUT/tiles > $OUT/tiles.log 2>&1; echo "tiles rc=$? $(date +%T)" >> $OUT/rc.txt
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 .probe/fa_probe.py > $OUT/fa_probe.log 2>&1; echo "probe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/t_gemm.log; grep -E "M=|round|Error|error" $OUT/tiles.log | cut -c1-190 | tail -75; grep -v "^20\|INFO" $OUT/fa_probe.log | cut -c1-420 | tail -20
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
