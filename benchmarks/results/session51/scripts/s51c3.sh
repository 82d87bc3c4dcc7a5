# session 51 c3: the align's CUDA tests, then the align A/B (one kernel at decode sizes, chunks of 16) at batch 8-128
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "sorted or graph or chain or w8a8" > $OUT/t_moe.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 330 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,16,32,64,128 --contexts 512 \
  --variants new,new-fp8,new2,new2-fp8 --variants-json '{"two":{"moe_align_one_max_pairs":0},"s50":{"moe_align_one_max_pairs":0,"moe_align_small_chunk":128},"two-fp8":{"moe_align_one_max_pairs":0},"s50-fp8":{"moe_align_one_max_pairs":0,"moe_align_small_chunk":128}}' \
  --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 3 $OUT/t_moe.log; grep FAILED $OUT/t_moe.log | head
grep -hE "decode B=" $OUT/moe.log | cut -c1-100
cd $OUT && tar cJf moe_c3.tar.xz moe && rm -rf moe
