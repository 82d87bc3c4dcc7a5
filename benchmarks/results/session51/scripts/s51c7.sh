# session 51 c7: the one-token FP8 experts kernel alone against the two Triton kernels, and its phases by CTA
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/ab_moe_b1.py --out $OUT/ab --variants '{"nw16": {}, "nw8": {"NW": 8}}' > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 40 $OUT/ab.log | cut -c1-200
