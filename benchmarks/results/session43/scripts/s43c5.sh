# session 43, c5: which FP8 CUDA tests failed in c4 (two F's in a run the timeout cut before its summary), and
# whether they fail with per-channel skinny_mma bounded at 16 tokens again (the default before this session)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
T="tests/model_wrapper/test_fp8_checkpoint.py tests/model_wrapper/test_fp8_pertensor.py tests/kernels/test_fp8_act.py"
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda $T \
  > $OUT/t32.log 2>&1; echo "t32 rc=$? $(date +%T)" >> $OUT/rc.txt
sed -i 's/fp8_skinny_mma_row_max_tokens: int = 32/fp8_skinny_mma_row_max_tokens: int = 16/' model_wrapper/kernels/config.py
grep -n "row_max_tokens: int" model_wrapper/kernels/config.py >> $OUT/rc.txt
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda $T --deselect \
  "tests/model_wrapper/test_fp8_pertensor.py" > $OUT/t16.log 2>&1; echo "t16 rc=$? $(date +%T)" >> $OUT/rc.txt
git checkout model_wrapper/kernels/config.py
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "PASSED|FAILED|ERROR|^E .*assert|AssertionError" $OUT/t32.log $OUT/t16.log | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
