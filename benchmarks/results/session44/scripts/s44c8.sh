# session 44 c8: session 43's H200 request (session43/scripts/next_s44c2.sh) with shorter timeouts (an H200 came for c7)
# request for a session-44 device call, H200 only (session 42 wrote it for session 43, which got no H200; the script does nothing on an H100):
#   cp benchmarks/results/session43/scripts/next_s44c2.sh .probe/c2.sh; run "bash .probe/c2.sh" carrying .gpu, .probe
# Issue 25 on the H200, where the launches tuned on H100s fall furthest short (session 42 c7 / c6):
# FP8 batch 1 at 1.38x its floor (H100 1.20x), the e4m3 KV decode attention at 0.60-0.66 of copy bandwidth.
# 0. (session 43) fp8_skinny_mma_row_max_tokens = 32 against 16 at batch 16-32, measured on H100s only
# 1. the FP8 GEMV's tiles / warps / rounds at 1-2 tokens on the H200 (ab_fp8_gemv.py's sweep, t64k added)
# 3. (issue 26, batch 1: 1.70x on the H200) sweep_moe's GEMV switches at 1-2 tokens, bf16 and FP8
# 2. the e4m3 decode attention's launches by batch on the H200 (bench_fp8_kv.py --sweep --by-batch; with session 42's
#    8-warp 128-key candidates: sm90 build at 96 registers, no spills, two K / V buffers)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
if grep -q H200 $OUT/gpus.txt; then
  timeout 140 taskset -c 0-15 python3 benchmarks/ab_fp8_gemv.py --tokens 1,2 --only "default,t16k w4,t8k w4,t64k w4,t32k w8,r1,r4" --out $OUT/gemv > $OUT/gemv.log 2>&1; echo "gemv rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 220 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --sweep --by-batch --out $OUT/kv > $OUT/kv.log 2>&1; echo "kv rc=$? $(date +%T)" >> $OUT/rc.txt
  V='{"row16": {"fp8_skinny_mma_row_max_tokens": 16}, "again": {}}'  # session 43's per-channel bound, H100-measured only
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 16,24,32 --configs fp8 \
    --fp8-variants "$V" --out $OUT/row > $OUT/row.log 2>&1; echo "row rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 90 taskset -c 0-15 python3 benchmarks/sweep_moe.py --switches --tokens 1,2 --out $OUT/moe_switches.json > $OUT/moe_switches.log 2>&1; echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
fi
cat $OUT/gpus.txt $OUT/rc.txt; grep -iE "layer|sum" $OUT/gemv.log 2>/dev/null | tail -20; grep -E "geomean|best|B=" $OUT/kv.log 2>/dev/null | tail -30; grep -E "^T=" $OUT/moe_switches.log 2>/dev/null | cut -c1-100; grep -hE "^decode " $OUT/row.log 2>/dev/null
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
