# session 41 call c1: W8A8 FP8 experts (moe_fp8_w8a8) against the weight-only grouped GEMMs: bench_moe decode B=8/32/128
# + prefill 1k/4k, sweep_moe's switch rows; then the MoE and attention CUDA tests (the kernels refactored in session 40)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); G1=1; [ "$NG" -lt 2 ] && G1=0
T=tests/model_wrapper; K=tests/kernels
tst() {  # gpu cores timeout file [pytest args]
  n=$(basename $4 .py); CUDA_VISIBLE_DEVICES=$1 OMP_NUM_THREADS=2 timeout $3 taskset -c $2 python3 -m pytest -q -rA -p no:cacheprovider -m cuda $4 $5 > $OUT/t_$n.log 2>&1; echo "$n rc=$? $(date +%T)" >> $OUT/rc.txt; }
tests() {
  tst $1 0-1 220 $K/test_moe_kernel.py & tst $1 2-3 220 $T/test_moe.py & tst $1 4-5 220 $T/test_moe_fp8_formats.py &
  tst $1 6-7 220 $K/test_decode_attention.py & tst $1 8-9 220 $K/test_prefill_attention.py & tst $1 10-11 220 $T/test_verify_graph.py &
  tst $1 12-13 220 $K/test_fp8_act.py & tst $1 14-15 220 $T/test_fp8_kv_cuda.py & wait; }
( CUDA_VISIBLE_DEVICES=0 timeout 270 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 8,32,128 --contexts 512 \
    --variants new-fp8,w8a8-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
  CUDA_VISIBLE_DEVICES=0 timeout 80 taskset -c 0-15 python3 benchmarks/sweep_moe.py --switches --only w8a8-fp8 --tokens 4,8,16,32,128 \
    --out $OUT/sweep > $OUT/sweep_moe.log 2>&1; echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
  [ "$G1" = 0 ] && tests 0 ) &
[ "$G1" = 1 ] && tests 1
wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|prefill T=" $OUT/bench_moe.log | cut -c1-150; grep -hiE "w8a8|best" $OUT/sweep_moe.log | head -20 | cut -c1-200
for f in $OUT/t_*.log; do echo "$(basename $f): $(grep -E '^(FAILED|ERROR)' $f | head -5 | cut -c1-200) $(tail -1 $f | cut -c1-120)"; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
