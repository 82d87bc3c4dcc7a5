# session 38 call: fa3fp8's request (GPU0, its patch on main) | main's target rows on this card (GPU1)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
run_helper() {  # name gpu cores timeout
  d=/tmp/wt/$1; mkdir -p $d $OUT/$1
  tar -C $ROOT --exclude=./.gpu --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu
  (cd $d && { git apply --whitespace=nowarn $ROOT/.wt/$1.patch > $OUT/$1.apply.log 2>&1 || patch -p1 < $ROOT/.wt/$1.patch >> $OUT/$1.apply.log 2>&1; }
   CUDA_VISIBLE_DEVICES=$2 OMP_NUM_THREADS=4 timeout $4 taskset -c $3 bash $ROOT/.wt/$1.request.sh > $OUT/$1.log 2>&1; echo "$1 rc=$? $(date +%T)" >> $OUT/rc.txt)
}
( [ -f .wt/fa3fp8.patch ] && run_helper fa3fp8 0 0-15 ${T0:-450} ) &
( [ -f .wt/autofp8.patch ] && run_helper autofp8 1 16-31 ${T1:-200}
  mkdir -p $OUT/main; export CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=4
  timeout 150 taskset -c 16-31 python3 benchmarks/bench_fp8.py --decode-only --batches 1,32 --out $OUT/main > $OUT/main/bench_fp8_decode.log 2>&1; echo "fp8dec rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 80 taskset -c 16-31 python3 benchmarks/bench_fp8_kv.py --batches 64,128 --contexts 2048,8192 --out $OUT/main > $OUT/main/bench_fp8_kv.log 2>&1; echo "fp8kv rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -45 $OUT/fa3fp8.log | cut -c1-220; tail -12 $OUT/autofp8.log | cut -c1-200; grep -E "ms|x floor|floor" $OUT/main/bench_fp8_decode.log | tail -12 | cut -c1-200; tail -6 $OUT/main/bench_fp8_kv.log | cut -c1-200;
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
