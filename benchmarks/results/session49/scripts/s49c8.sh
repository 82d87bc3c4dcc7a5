# session 49 c8 (H200): the gate_up GEMV's programs prefetching their experts' down rows into L2
# (KernelConfig.moe_gemv_prefetch_down) -- its bit-equality test, then decode at batch 1 / 2 / 4 against the default
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 90 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "prefetch_down" > $OUT/t_pfd.log 2>&1
echo "prefetch tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4 --contexts 512 \
  --variants new,pfd,new2,pfd2,new-fp8,pfd-fp8,new2-fp8,pfd2-fp8 --out $OUT/moe_pfd > $OUT/moe_pfd.log 2>&1
echo "moe pfd rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_pfd.log; grep -hE "decode B=" $OUT/moe_pfd.log | cut -c1-150
