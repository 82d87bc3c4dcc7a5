# session 42 c5: the per-token fused activation quantization against the unfused path, call by call; FP8 CUDA tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 .probe/fused_probe.py > $OUT/fused_probe.log 2>&1; echo "probe rc=$? $(date +%T)" >> $OUT/rc.txt
OMP_NUM_THREADS=8 timeout 240 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_fp8_act.py \
  tests/model_wrapper/test_fp8_checkpoint.py -k "act or within_bounds" > $OUT/t_fp8.log 2>&1; echo "t_fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -v "Loading\|^20" $OUT/fused_probe.log | tail -25; grep -E "PASS|FAIL|passed|failed|Error" $OUT/t_fp8.log | tail -30
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
