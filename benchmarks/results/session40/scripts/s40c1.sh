# session 40 call c1: fp8wide (GPU0) | fp8kvdec (GPU1), then main's CUDA tests split over both GPUs
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd); NG=$(nvidia-smi -L | wc -l)
run_helper() {  # name gpu cores timeout
  d=/tmp/wt/$1; mkdir -p $d $OUT/$1
  tar -C $ROOT --exclude=./.gpu --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu
  (cd $d && { [ -s $ROOT/.wt/$1.patch ] && git apply --whitespace=nowarn $ROOT/.wt/$1.patch > $OUT/$1.apply.log 2>&1; }
   source benchmarks/fa3_fp8_env.sh > /dev/null 2>&1
   CUDA_VISIBLE_DEVICES=$2 OMP_NUM_THREADS=4 timeout $4 taskset -c $3 bash $ROOT/.wt/$1.request.sh > $OUT/$1.log 2>&1; echo "$1 rc=$? $(date +%T)" >> $OUT/rc.txt)
}
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
T=tests/model_wrapper
( run_helper fp8wide 0 0-15 ${T0:-250}
  CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 timeout ${TA:-170} taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
    $T/test_fp8_pertensor.py $T/test_mixed_graph.py $T/test_online_fp8.py $T/test_moe_fp8_formats.py > $OUT/testsA.log 2>&1; echo "testsA rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( run_helper fp8kvdec $G1 $C1 ${T1:-300}
  CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=4 timeout ${TB:-170} taskset -c $C1 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
    tests/kernels/test_fp8_kernels.py $T/test_fp8_checkpoint.py $T/test_fa3_fp8_prefill_cuda.py $T/test_fa3_fp8.py > $OUT/testsB.log 2>&1; echo "testsB rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/gpus.txt $OUT/rc.txt; tail -22 $OUT/fp8wide.log | cut -c1-220; tail -22 $OUT/fp8kvdec.log | cut -c1-220
for f in A B; do grep -E "FAILED|ERROR|passed|failed" $OUT/tests$f.log | cut -c1-220 | tail -8; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
