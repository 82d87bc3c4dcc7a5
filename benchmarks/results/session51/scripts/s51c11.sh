# session 51 c11: the one-token FP8 experts kernel, sixth form (the fifth with down.s copies after gate_up.s products):
# its tests, alone against the two Triton kernels with its phases, and the step
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_b1_cuda.py -x > $OUT/t_b1.log 2>&1
echo "b1 tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/ab_moe_b1.py --out $OUT/ab --variants '{"nw16": {}}' > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1 --contexts 512 \
  --variants new-fp8,new2-fp8 --variants-json '{"off-fp8":{"moe_b1_cuda":false},"off2-fp8":{"moe_b1_cuda":false}}' --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 15 $OUT/t_b1.log | cut -c1-300; tail -n 20 $OUT/ab.log | cut -c1-200; grep -hE "decode B=|logits" $OUT/moe.log | cut -c1-120
cd $OUT && tar cJf moe_c11.tar.xz moe && rm -rf moe
