# session 39 call e6: helpers' round-1 requests (fp8wide GPU0, fp8kvdec GPU1), then the lead's rows
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd); NG=$(nvidia-smi -L | wc -l)
run_helper() {  # name gpu cores timeout
  d=/tmp/wt/$1; mkdir -p $d $OUT/$1
  tar -C $ROOT --exclude=./.gpu --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu
  (cd $d && { git apply --whitespace=nowarn $ROOT/.wt/$1.patch > $OUT/$1.apply.log 2>&1 || patch -p1 < $ROOT/.wt/$1.patch >> $OUT/$1.apply.log 2>&1; }
   source benchmarks/fa3_fp8_env.sh > /dev/null 2>&1
   CUDA_VISIBLE_DEVICES=$2 OMP_NUM_THREADS=4 timeout $4 taskset -c $3 bash $ROOT/.wt/$1.request.sh > $OUT/$1.log 2>&1; echo "$1 rc=$? $(date +%T)" >> $OUT/rc.txt)
}
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
mkdir -p $OUT/main
( [ -f .wt/fp8wide.request.sh ] && run_helper fp8wide 0 0-15 ${T0:-250}
  CUDA_VISIBLE_DEVICES=0 timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 4,8,16 --configs fp8 --fp8-variants '{"skinny": {"fp8_skinny_mma": false}, "again": {}}' --out $OUT/main/dec_block > $OUT/main/dec_block.log 2>&1; echo "decbl rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( [ -f .wt/fp8kvdec.request.sh ] && run_helper fp8kvdec $G1 $C1 ${T1:-250}
  CUDA_VISIBLE_DEVICES=$G1 timeout 100 taskset -c $C1 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 4,8,16 --configs fp8 --fp8-variants '{"skinny": {"fp8_skinny_mma": false}, "again": {}}' --out $OUT/main/dec_channel > $OUT/main/dec_channel.log 2>&1; echo "decch rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -25 $OUT/fp8wide.log 2>/dev/null | cut -c1-200; tail -25 $OUT/fp8kvdec.log 2>/dev/null | cut -c1-200
grep -E "^decode" $OUT/main/dec_block.log $OUT/main/dec_channel.log | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
