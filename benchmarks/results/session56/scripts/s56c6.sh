# session 56 c6: CUDA tests under moe_grid_n_first (the new default): the MoE kernels' grouped paths (bf16, FP8
# weight-only, W8A8, graph replay, the norm-quantized x), the MoE model tests on the GPU (bf16 against transformers,
# FP8 experts, graphs) and the mixed-graph MoE cases
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 280 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "sorted or w8a8 or graph or norm_quantized or chain" > $OUT/tk.log 2>&1
echo "kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 python3 -m pytest -q -m cuda tests/model_wrapper/test_moe.py tests/model_wrapper/test_moe_norm_quant.py tests/model_wrapper/test_moe_router_norm_cuda.py > $OUT/tm.log 2>&1
echo "model tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/tk.log; tail -3 $OUT/tm.log
