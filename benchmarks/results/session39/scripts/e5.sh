# session 39 call e5 (lead): skinny_mma K step / programs sweep at 8 tokens (per-channel GPU0, block GPU1) + its CUDA tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); mkdir -p $OUT/main
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
sweep() {  # scales gpu cores
  for c in default k128 k512 p256; do
    kc=""; [ $c != default ] && kc="--kernel-config .probe/$c.json"
    CUDA_VISIBLE_DEVICES=$2 timeout 60 taskset -c $3 python3 benchmarks/bench_fp8_gemm.py --tokens 8 --scales $1 $kc --out $OUT/main/gemm_$1_$c > $OUT/main/gemm_$1_$c.log 2>&1; echo "$1 $c rc=$? $(date +%T)" >> $OUT/rc.txt
  done
}
( sweep channel 0 0-15 ) &
( CUDA_VISIBLE_DEVICES=$G1 timeout 60 taskset -c $C1 python3 -m pytest -q -m cuda -p no:cacheprovider tests/kernels/test_fp8_kernels.py -k "skinny_mma" > $OUT/main/tests.log 2>&1; echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
  sweep block128 $G1 $C1 ) &
wait
cat $OUT/rc.txt; tail -2 $OUT/main/tests.log
for f in $OUT/main/gemm_*.log; do echo "== $f"; grep -E "fp8 skinny|bf16  " $f | cut -c1-80; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
