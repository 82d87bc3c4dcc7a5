# session 54 c7: the FP8 GEMV on x held in fp32 (no conversion of x: sm90 SASS instructions a weight down 5.41 -> 4.06,
# o 4.14 -> 3.94, gate_up 4.48 -> 4.34), 1 token, against its bf16 x; twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
for r in 1 2; do
timeout 200 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1 --x32 --only default --out $OUT/ab$r > $OUT/ab$r.log 2>&1
echo "ab$r rc=$? $(date +%T)" >> $OUT/rc.txt
done
tar cf $OUT/json.tar -C $OUT ab1 ab2 2>/dev/null; rm -rf $OUT/ab1 $OUT/ab2
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "M=1 (default|x fp32|bf16)|^  " $OUT/ab1.log $OUT/ab2.log | cut -c1-110
