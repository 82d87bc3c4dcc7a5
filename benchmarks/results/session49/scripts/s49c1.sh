# request for session 49's first device call (an H200, ~9 min; written in session 48, runs as is on main):
# cp benchmarks/results/session48/scripts/next_s49c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# Session 48 turned moe_w8a8_norm_quant on (the norm before the experts quantizes x for the W8A8 small tiles, from 256
# pairs). Its c5 ran the FP8 / MoE model-level CUDA tests with it only until the call's time limit (18 passed, none
# failed), and the CUDA kernel suite to 54% (none failed). This call runs both whole under main's defaults.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 300 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper -k "fp8 or moe" > $OUT/t_models.log 2>&1
echo "model fp8 / moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 240 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels > $OUT/t_kernels.log 2>&1
echo "kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_models.log $OUT/t_kernels.log; grep -h FAILED $OUT/t_*.log | head -20
