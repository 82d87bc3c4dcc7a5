# session 49 c3 (H200): main's CUDA tests whole under its final defaults (c1 reached 49 of the FP8 / MoE model tests and
# 134 of the kernel suite before its time limits), in parallel with pytest-xdist (wheels carried in .probe).
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
pip install -q --no-deps .probe/execnet-*.whl .probe/pytest_xdist-*.whl >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 python3 -m pytest -q -rfE -n 6 -m cuda tests/model_wrapper -k "fp8 or moe" > $OUT/t_models.log 2>&1
echo "model fp8 / moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 370 python3 -m pytest -q -rfE -n 8 -m cuda tests/kernels > $OUT/t_kernels.log 2>&1
echo "kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 4 $OUT/t_models.log $OUT/t_kernels.log; grep -hE "^(FAILED|ERROR)" $OUT/t_*.log | head -30
