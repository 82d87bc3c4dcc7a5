# session 39 call e2 (lead): skinny_mma A/B (kernel + decode step), quantize_q GPU time
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); mkdir -p $OUT/main
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
( export CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4
  timeout 100 taskset -c 0-15 python3 -m pytest -q -m cuda -p no:cacheprovider tests/kernels/test_fp8_kernels.py -k "skinny_mma or every_path" > $OUT/main/skinny_mma_tests.log 2>&1; echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8_gemm.py --tokens 4,8,16 --scales block128,channel --out $OUT/main/gemm > $OUT/main/fp8_gemm.log 2>&1; echo "gemm rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=4
  timeout 60 taskset -c $C1 python3 benchmarks/bench_fp8_attention.py --cases 1x4k --arms fa3_bf16_ragged,fa3_e4m3_paged --out $OUT/main/attn > $OUT/main/fp8_attention.log 2>&1; echo "attn rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 200 taskset -c $C1 python3 benchmarks/bench_fp8.py --decode-only --batches 4,8,16 --configs bf16,fp8 --fp8-variants '{"mma": {"fp8_skinny_mma": true}, "again": {}}' --out $OUT/main/dec > $OUT/main/bench_fp8_decode.log 2>&1; echo "dec rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -3 $OUT/main/skinny_mma_tests.log
grep -E "skinny|bf16  " $OUT/main/fp8_gemm.log | cut -c1-130
python3 -c "import json;d=json.load(open('$OUT/main/attn/fp8_attention.json'));c=d['cases']['1x4k'];print({k:v for k,v in c.items() if 'quant' in k or 'cast' in k})"
grep -E "^decode" $OUT/main/bench_fp8_decode.log | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
