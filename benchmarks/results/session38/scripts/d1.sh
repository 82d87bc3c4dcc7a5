# session 38 call 1: ctmoe diagnosis (GPU0, branch patch) | main's unrun CUDA tests (GPU1) | then the TP=2 graphs test
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
run_helper() {  # name gpu cores timeout
  d=/tmp/wt/$1; mkdir -p $d
  tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu
  (cd $d && { git apply --whitespace=nowarn $ROOT/.wt/$1.patch > $OUT/$1.apply.log 2>&1 || patch -p1 < $ROOT/.wt/$1.patch >> $OUT/$1.apply.log 2>&1; }
   CUDA_VISIBLE_DEVICES=$2 OMP_NUM_THREADS=4 timeout $4 taskset -c $3 bash $ROOT/.wt/$1.request.sh > $OUT/$1.log 2>&1; echo "$1 rc=$? $(date +%T)" >> $OUT/rc.txt)
}
( run_helper ctmoe 0 0-15 ${T0:-270} ) &
( CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=4 timeout ${T1:-270} taskset -c 16-31 python3 -m pytest -p no:cacheprovider -m cuda -rA -q tests/model_wrapper/test_online_fp8.py tests/model_wrapper/test_fp8_checkpoint.py > $OUT/main_fp8_tests.log 2>&1; echo "main_fp8 rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
mkdir -p $OUT/tp2 && timeout ${TT:-300} python3 -m pytest -v -p no:cacheprovider -m cuda -rA --durations=0 tests/model_wrapper/test_all_reduce.py::test_tp2_fp8_and_moe_graphs_on_two_gpus > $OUT/tp2/tests.log 2>&1; echo "tp2 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/rc.txt; cat $OUT/ctmoe.log | cut -c1-220; grep -E "PASSED|FAILED|passed|failed" $OUT/main_fp8_tests.log | cut -c1-200; tail -3 $OUT/tp2/tests.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
