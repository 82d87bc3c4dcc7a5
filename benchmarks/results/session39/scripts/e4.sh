# session 39 call e4 (lead): skinny f32 upcast / skinny_mma kernel rows and decode steps (per-channel and block)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); mkdir -p $OUT/main
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
( export CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4
  timeout 30 taskset -c 0-15 python3 -m pytest -q -m cuda -p no:cacheprovider tests/kernels/test_fp8_kernels.py -k "skinny_mma" > $OUT/main/tests.log 2>&1; echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 60 taskset -c 0-15 python3 benchmarks/bench_fp8_gemm.py --tokens 4,8,16 --scales channel,block128 --out $OUT/main/gemm_default > $OUT/main/fp8_gemm_default.log 2>&1; echo "gemm0 rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 60 taskset -c 0-15 python3 benchmarks/bench_fp8_gemm.py --tokens 4,8,16 --scales channel --kernel-config .probe/f32up.json --out $OUT/main/gemm_f32up > $OUT/main/fp8_gemm_f32up.log 2>&1; echo "gemm1 rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=4
  timeout 120 taskset -c $C1 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 4,8,16 --configs bf16,fp8 --fp8-variants '{"f32up": {"fp8_skinny_f32_upcast": true}, "mma": {"fp8_skinny_mma": true}, "again": {}}' --out $OUT/main/dec_channel > $OUT/main/dec_channel.log 2>&1; echo "decch rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 100 taskset -c $C1 python3 benchmarks/bench_fp8.py --decode-only --batches 4,8,16 --configs fp8 --fp8-variants '{"mma": {"fp8_skinny_mma": true}}' --out $OUT/main/dec_block > $OUT/main/dec_block.log 2>&1; echo "decbl rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -2 $OUT/main/tests.log
grep -E "M=   (8|16) (fp8 skinny|fp8 \(|bf16  )" $OUT/main/fp8_gemm_default.log | cut -c1-100
grep -E "M=   (8|16) (fp8 skinny |fp8 \()" $OUT/main/fp8_gemm_f32up.log | cut -c1-100
grep -E "^decode" $OUT/main/dec_channel.log $OUT/main/dec_block.log | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
