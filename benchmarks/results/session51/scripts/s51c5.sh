# session 51 c5: the one-token FP8 experts kernel (kernels/moe_b1_cuda.py): its tests, the MoE kernel tests around it, the A/B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_b1_cuda.py -x > $OUT/t_b1.log 2>&1
echo "b1 tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "fp8 and not w8a8" > $OUT/t_moe.log 2>&1
echo "moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 250 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1 --contexts 512,2048 \
  --variants new-fp8,new2-fp8 --variants-json '{"off-fp8":{"moe_b1_cuda":false},"off2-fp8":{"moe_b1_cuda":false}}' \
  --profile new-fp8,off-fp8 --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 25 $OUT/t_b1.log | cut -c1-300; tail -n 3 $OUT/t_moe.log; grep FAILED $OUT/t_moe.log | head
grep -hE "decode B=|logits" $OUT/moe.log | cut -c1-120; grep -A16 -- "--- .*B=1 ctx" $OUT/moe.log | grep -E "^---|experts|router|idle|GPU span"
cd $OUT && tar cJf moe_c5.tar.xz moe && rm -rf moe
