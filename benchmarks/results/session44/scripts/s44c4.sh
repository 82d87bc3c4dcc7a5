# session 44 c4: on an H200, session 43's queued H200 work (next_s44c2.sh); on an H100, the residual add + RMSNorm inside
# the FP8 qkv GEMV at batch 1 (gemv_add_norm_qkv, off by default: session 34 measured FP8 8B -0.6%, Qwen3-30B-A3B bf16
# +2-3%) on the 8B FP8 model (per-channel, block) and the MoE model with block-FP8 attention projections, rows twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
if grep -q H200 $OUT/gpus.txt; then
  bash benchmarks/results/session43/scripts/next_s44c2.sh
  exit 0
fi
Q='"gemv_add_norm_qkv": true'
for k in channel block; do
  timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 1 --configs fp8 \
    --fp8-variants "{\"qkvnorm\": {$Q}, \"base2\": {}, \"qkvnorm2\": {$Q}}" --out $OUT/fp8_$k > $OUT/fp8_$k.log 2>&1
  echo "fp8 $k rc=$? $(date +%T)" >> $OUT/rc.txt
done
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1 --contexts 512 \
  --variants new,addnorm-qkv,new2,new-fp8,ckpt-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
