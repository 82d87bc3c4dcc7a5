# session 58 c2: main's CUDA tests whole (last run whole in session 49), pytest-xdist (wheels carried in .probe), 14 workers
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
pip install -q --no-deps .probe/execnet-*.whl .probe/pytest_xdist-*.whl >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 560 python3 -m pytest -q -rfE -n 14 --durations=15 -m cuda tests > $OUT/t_all.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 25 $OUT/t_all.log; grep -hE "^(FAILED|ERROR)" $OUT/t_all.log | head -40
