# session 49 c4 (H200): the CUDA kernel suite whole (c3 reached ~94% in 370 s with 8 workers, none failed), 12 workers.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
pip install -q --no-deps .probe/execnet-*.whl .probe/pytest_xdist-*.whl >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 540 python3 -m pytest -q -rfE -n 12 --durations=12 -m cuda tests/kernels > $OUT/t_kernels.log 2>&1
echo "kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 20 $OUT/t_kernels.log; grep -hE "^(FAILED|ERROR)" $OUT/t_*.log | head -30
