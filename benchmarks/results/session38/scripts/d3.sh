source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
d=/tmp/wt/ctmoe; mkdir -p $d
tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
ln -s $ROOT/.gpu $d/.gpu
(cd $d && git checkout -q -- model_wrapper/online_fp8.py tests/model_wrapper/test_online_fp8.py 2>/dev/null; git apply --whitespace=nowarn $ROOT/.wt/ctmoe.patch > $OUT/apply.log 2>&1; cp .probe/test_ctdiag.py tests/model_wrapper/; CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m pytest -s -q -p no:cacheprovider -m cuda tests/model_wrapper/test_ctdiag.py 2>&1 | grep -E "^ROW|Error|passed|failed" > $OUT/ctdiag.log) &
(CUDA_VISIBLE_DEVICES=1 timeout 330 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/model_wrapper/test_online_fp8.py tests/model_wrapper/test_moe.py tests/model_wrapper/test_moe_fp8_shards.py 2>&1 | grep -E "PASSED|FAILED|Error|passed|failed" > $OUT/online.log) &
wait
cat $OUT/online.log $OUT/ctdiag.log | cut -c1-250
