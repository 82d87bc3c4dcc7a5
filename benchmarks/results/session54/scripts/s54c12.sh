# session 54 c12: the FP8 GEMV with K split over programs (fp8_gemv_split: fp32 partial sums, each program reading
# only its slice of x) against the default at 1 token: down (x's traffic, c7), o, qkv; twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
for r in 1 2; do
timeout 200 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1 --only default --splits 2,4,7,8,14 \
  --shapes down,o,qkv --out $OUT/ab$r > $OUT/ab$r.log 2>&1
echo "ab$r rc=$? $(date +%T)" >> $OUT/rc.txt
done
tar cf $OUT/json.tar -C $OUT ab1 ab2 2>/dev/null; rm -rf $OUT/ab1 $OUT/ab2
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "M=1 (default|split)" $OUT/ab1.log $OUT/ab2.log | cut -c1-100
