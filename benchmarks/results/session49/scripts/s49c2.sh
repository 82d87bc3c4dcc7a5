# session 49 c2 (H200): the session-48 kernel tests that c1's partial suite did not reach, then the rounds A/B
# (next_s49c2.sh, its rounds test merged into the first pytest) and the nqpre prefill A/B.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 110 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py tests/kernels/test_fp8_act.py \
  tests/model_wrapper/test_online_fp8.py::test_cuda_quantization_is_the_cpu_quantizers \
  -k "w8a8 or norm_quant or rounds or fp8_act or quantized_x or cpu_quantizers" > $OUT/t_rounds.log 2>&1
echo "targeted tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 130 taskset -c 0-15 python3 benchmarks/sweep_moe.py --switches --only gr2,dr2,dr3,gr2dr3,gr2-fp8,dr2-fp8,dr3-fp8,gr2dr3-fp8 \
  --tokens 1,2,4 --rounds 2 --out $OUT/sweep/moe_rounds.json > $OUT/sweep.log 2>&1
echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 190 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4 --contexts 512 \
  --variants new,dr2,dr3,gr2dr3,new-fp8,dr2-fp8,dr3-fp8,gr2dr3-fp8,new2-fp8,new2 --out $OUT/moe_rounds > $OUT/moe_rounds.log 2>&1
echo "moe rounds rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 130 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 32 --contexts 512 \
  --variants new-fp8,nqpre-fp8,new2-fp8 --out $OUT/moe_nqpre > $OUT/moe_nqpre.log 2>&1
echo "moe nqpre rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_rounds.log; grep -h FAILED $OUT/t_*.log | head; grep -vE "^\s*$" $OUT/sweep.log | tail -n 40 | cut -c1-160
grep -hE "decode B=|prefill" $OUT/moe_rounds.log $OUT/moe_nqpre.log | cut -c1-150
