# session 54 c14: the FP8 checkpoint CUDA tests and the FP8 GEMV's CUDA kernel tests under the final defaults
# (fp8_gemv_x_once on)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 250 python3 -m pytest -m cuda -q tests/model_wrapper/test_fp8_checkpoint.py > $OUT/tm.log 2>&1
echo "tm rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 -m pytest -m cuda -q tests/kernels/test_fp8_kernels.py -k "gemv" > $OUT/tk.log 2>&1
echo "tk rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/tm.log; tail -3 $OUT/tk.log
