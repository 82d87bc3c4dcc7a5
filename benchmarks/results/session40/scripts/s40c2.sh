# session 40 call c2: e4m3 decode launch by batch at 5 stages (GPU0) | main's CUDA tests, one process a file (GPU1)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); G1=1; [ "$NG" -lt 2 ] && G1=0
V='[{"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":3,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":3,"maxnreg":128,"split_factor":2},
 {"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128,"split_factor":2},
 {"fp8_math":"fp16_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128},
 {"fp8_math":"fp16_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128,"split_factor":2},
 {"fp8_math":"bits_vreg","block_n":128,"num_warps":4,"num_stages":5,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":128,"num_warps":4,"num_stages":5,"maxnreg":128,"split_factor":2},
 {"fp8_math":"fp16_vreg","block_n":128,"num_warps":4,"num_stages":5,"maxnreg":128}]'
( CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 timeout 240 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --sweep --by-batch --variants "$V" \
   --cases 1x8192,4x8192,8x2048,8x8192,16x2048,16x8192,32x2048,32x8192,64x2048,64x8192,128x2048,128x8192 --out $OUT/bybatch > $OUT/bybatch.log 2>&1
  echo "bybatch rc=$? $(date +%T)" >> $OUT/rc.txt ) &
T=tests/model_wrapper; i=0
for f in tests/kernels/test_fp8_kernels.py $T/test_fp8_checkpoint.py $T/test_fa3_fp8_prefill_cuda.py $T/test_fa3_fp8.py \
         $T/test_fp8_pertensor.py $T/test_mixed_graph.py $T/test_online_fp8.py $T/test_moe_fp8_formats.py \
         tests/kernels/test_decode_attention.py $T/test_fp8_kv_cuda.py tests/kernels/test_prefill_attention.py; do
  n=$(basename $f .py); c=$((16 + i % 16)); i=$((i+1))
  ( CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=1 timeout ${TT:-280} taskset -c $c python3 -m pytest -q -rA -p no:cacheprovider -m cuda $f > $OUT/t_$n.log 2>&1; echo "$n rc=$? $(date +%T)" >> $OUT/rc.txt ) &
done
wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -h "best at batch\|geomean\|^  0\." $OUT/bybatch.log | cut -c1-220
for f in $OUT/t_*.log; do echo "$(basename $f): $(grep -E '^(FAILED|ERROR)' $f | head -5 | cut -c1-200) $(tail -1 $f | cut -c1-120)"; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
