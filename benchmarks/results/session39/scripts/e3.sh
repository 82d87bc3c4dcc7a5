# session 39 call e3 (lead): skinny f32 upcast + skinny_mma (pre-quantized x) kernel rows; Triton prefill attention e4m3 modes; CUDA tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); mkdir -p $OUT/main
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
( export CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8_gemm.py --tokens 4,8,16 --scales channel --out $OUT/main/gemm_default > $OUT/main/fp8_gemm_default.log 2>&1; echo "gemm0 rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8_gemm.py --tokens 4,8,16 --scales channel --kernel-config .probe/f32up.json --out $OUT/main/gemm_f32up > $OUT/main/fp8_gemm_f32up.log 2>&1; echo "gemm1 rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=4
  timeout 60 taskset -c $C1 python3 benchmarks/bench_fp8_attention.py --cases 1x4k,4x1k --arms fa3_bf16_ragged,triton_bf16_paged,triton_bf16q_e4m3_paged,triton_e4m3_fp16_vreg,triton_e4m3_bits_vreg --out $OUT/main/attn > $OUT/main/fp8_attention.log 2>&1; echo "attn rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 100 taskset -c $C1 python3 -m pytest -q -m cuda -p no:cacheprovider tests/kernels/test_prefill_attention.py tests/kernels/test_fp8_kernels.py -k "e4m3 or skinny" > $OUT/main/tests.log 2>&1; echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt; tail -3 $OUT/main/tests.log
grep -E "fp8 skinny|fp8 \(|bf16  " $OUT/main/fp8_gemm_default.log | cut -c1-100
grep -E "fp8 skinny |fp8 \(" $OUT/main/fp8_gemm_f32up.log | cut -c1-100
python3 -c "
import json;d=json.load(open('$OUT/main/attn/fp8_attention.json'))
for c,v in d['cases'].items(): print(c, {k:(round(x['ms'],4), x['err_own']['max_rel']) for k,x in v.items() if isinstance(x,dict) and 'ms' in x})"
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
