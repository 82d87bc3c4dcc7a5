source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
ROOT=$(pwd); d=/tmp/wt/ctmoe; rm -rf $d; mkdir -p $d
tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
ln -s $ROOT/.gpu $d/.gpu
cd $d && git apply --whitespace=nowarn $ROOT/.wt/ctmoe.patch > $OUT/apply.log 2>&1; cp .probe/test_ctdiag.py tests/model_wrapper/
for f in qwen3_moe qwen2_moe mixtral; do
  (CUDA_VISIBLE_DEVICES=$([ $f = mixtral ] && echo 1 || echo 0) timeout 250 python3 -m pytest -s -q -p no:cacheprovider -m cuda "tests/model_wrapper/test_ctdiag.py::test_diag[$f]" 2>&1 | grep -E "^ROW|Error|passed|failed" > $OUT/ctdiag_$f.log) &
  [ $f = qwen3_moe ] && sleep 1
done
wait
cat $OUT/ctdiag_*.log | cut -c1-250
