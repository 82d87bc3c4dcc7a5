# session 51 c13: down waiting on a count of gate_up programs (moe_gemv_act_count) instead of the PDL wait: tests, batch 1-4 A/B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "count or chain" > $OUT/t_count.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 250 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4 --contexts 512 \
  --variants new,new2,new-fp8,new2-fp8 --variants-json '{"cnt":{"moe_gemv_act_count":true},"cnt-fp8":{"moe_gemv_act_count":true}}' --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 3 $OUT/t_count.log; grep FAILED $OUT/t_count.log | head; grep -hE "decode B=|logits" $OUT/moe.log | cut -c1-120
cd $OUT && tar cJf moe_c13.tar.xz moe && rm -rf moe
