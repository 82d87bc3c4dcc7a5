# session 42 c6: the GEMM operands of the per-token fused quantization against the unfused path; on an H200 also
# issue 25's FP8 KV decode attention rows and the skinny-tile step A/B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 120 taskset -c 0-15 python3 .probe/fused_probe2.py > $OUT/fused_probe2.log 2>&1; echo "probe rc=$? $(date +%T)" >> $OUT/rc.txt
if grep -q H200 $OUT/gpus.txt; then
  timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/kv > $OUT/kv.log 2>&1; echo "kv rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 300 taskset -c 0-15 python3 benchmarks/ab_skinny_tiles.py --steps --out $OUT/tiles > $OUT/tiles.log 2>&1; echo "tiles rc=$? $(date +%T)" >> $OUT/rc.txt
fi
cat $OUT/gpus.txt $OUT/rc.txt; grep -v "Loading\|^20\|Writing\|Warning" $OUT/fused_probe2.log | tail -22; grep -E "B=|bandwidth" $OUT/kv.log 2>/dev/null | cut -c1-200
grep -E "round" $OUT/tiles.log 2>/dev/null
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
