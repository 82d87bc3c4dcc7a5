# session 40 call c3: skinny_mma fused-quant decode A/B + CUDA tests (GPU0) | FP8 KV step A/B old vs new e4m3 launch + CUDA tests (GPU1)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); G1=1; C1=16; [ "$NG" -lt 2 ] && G1=0 && C1=0
T=tests/model_wrapper
tst() {  # gpu core timeout file
  n=$(basename $4 .py); CUDA_VISIBLE_DEVICES=$1 OMP_NUM_THREADS=1 timeout $3 taskset -c $2 python3 -m pytest -q -rA -p no:cacheprovider -m cuda $4 > $OUT/t_$n.log 2>&1; echo "$n rc=$? $(date +%T)" >> $OUT/rc.txt; }
( for k in block channel; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 taskset -c 0-7 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 4,8,16 --configs fp8 \
      --fp8-variants '{"noquant": {"fp8_skinny_mma_fused_quant": false}, "again": {}}' --out $OUT/fq_$k > $OUT/fq_$k.log 2>&1; echo "fq_$k rc=$? $(date +%T)" >> $OUT/rc.txt
  done
  tst 0 0 330 $T/test_mixed_graph.py & tst 0 1 200 tests/kernels/test_fp8_act.py & tst 0 2 200 $T/test_fp8_checkpoint.py & wait ) &
( OLD="d.LAUNCH['e4m3'] = dict(block_n=64, num_warps=4, num_stages=3, maxnreg=128, fp8_math='bits_vreg'); d.E4M3_BY_BATCH = ((16, {}), (32, {'split_factor': 2}), (64, {'fp8_math': 'fp16_vreg'}))"
  for r in old1 new1 old2 new2; do P=""; [ "${r:0:3}" = old ] && P="$OLD"
    CUDA_VISIBLE_DEVICES=$G1 timeout 80 taskset -c $C1-$((C1+7)) python3 -c "import sys, runpy; sys.path.insert(0, '.'); import model_wrapper.kernels.decode_attention as d; $P
sys.argv = ['bench_fp8.py', '--decode-only', '--configs', 'fp8+fp8kv', '--batches', '1,32,128', '--context', '2048', '--out', '$OUT/kv_$r']; runpy.run_path('benchmarks/bench_fp8.py', run_name='__main__')" > $OUT/kv_$r.log 2>&1; echo "kv_$r rc=$? $(date +%T)" >> $OUT/rc.txt
  done
  tst $G1 $C1 300 $T/test_fp8_kv_cuda.py & tst $G1 $((C1+1)) 200 tests/kernels/test_decode_attention.py & tst $G1 $((C1+2)) 200 tests/kernels/test_fp8_kernels.py & wait ) &
wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -h "^decode" $OUT/fq_*.log | cut -c1-150; for r in old1 new1 old2 new2; do echo "$r: $(grep -h '^decode' $OUT/kv_$r.log | cut -c1-120 | tr '\n' '|')"; done
for f in $OUT/t_*.log; do echo "$(basename $f): $(grep -E '^(FAILED|ERROR)' $f | head -5 | cut -c1-200) $(tail -1 $f | cut -c1-120)"; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
