# request for session 49's second device call (an H200, ~8 min; written in session 48, runs as is on main):
# cp benchmarks/results/session48/scripts/next_s49c2.sh .probe/c2.sh; run "bash .probe/c2.sh" carrying .gpu, .probe
# The decode path's register-tile expert GEMVs taking 2-3 tiles a program in turn (KernelConfig.moe_gemv_rounds for
# gate_up, moe_gemv_down_rounds for down; written in session 48, off): their bit-equality test on the GPU, a layer's
# experts alone (sweep_moe --switches) and the step (bench_moe) at 1-4 tokens, bf16 and FP8 experts, against the
# default in the same run. Issue 26's batch 1: bf16 1.71x, FP8 2.07x its floor (session 47, H200).
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "gemv_rounds_cuda" > $OUT/t_rounds.log 2>&1
echo "rounds tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/sweep_moe.py --switches --only gr2,dr2,dr3,gr2dr3,gr2-fp8,dr2-fp8,dr3-fp8,gr2dr3-fp8 \
  --tokens 1,2,4 --rounds 2 --out $OUT/sweep/moe_rounds.json > $OUT/sweep.log 2>&1
echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4 --contexts 512 \
  --variants new,dr2,dr3,gr2dr3,new-fp8,dr2-fp8,dr3-fp8,gr2dr3-fp8,new2-fp8,new2 --out $OUT/moe_rounds > $OUT/moe_rounds.log 2>&1
echo "moe rounds rc=$? $(date +%T)" >> $OUT/rc.txt
# the prefill tiles' x quantized by the norm as well (moe_w8a8_norm_quant_prefill, written in session 48, off): 1k / 4k
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 32 --contexts 512 \
  --variants new-fp8,nqpre-fp8,new2-fp8 --out $OUT/moe_nqpre > $OUT/moe_nqpre.log 2>&1
echo "moe nqpre rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_rounds.log; grep -vE "^\s*$" $OUT/sweep.log | tail -n 40 | cut -c1-160
grep -hE "decode B=|prefill" $OUT/moe_rounds.log $OUT/moe_nqpre.log | cut -c1-150
