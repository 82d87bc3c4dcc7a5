# session 41 call c3: W8A8 prefill tiles around c2's best (sweep_moe --prefill-only, bf16 beside); the Qwen3-30B-A3B
# benchmark with W8A8 experts and their tiles as defaults (new-fp8) against weight-only (wonly-fp8) and bf16 (new),
# B=1/8/32/128 + prefill, kernel breakdown of new at B=1/32; then the MoE / FP8-expert / verify / mixed-graph CUDA tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
T=tests/model_wrapper; K=tests/kernels
tst() {  # cores timeout file [pytest args]
  n=$(basename $3 .py)$5; CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=2 timeout $2 taskset -c $1 python3 -m pytest -q -rA -p no:cacheprovider -m cuda $3 $4 > $OUT/t_$n.log 2>&1; echo "$n rc=$? $(date +%T)" >> $OUT/rc.txt; }
timeout 100 taskset -c 0-15 python3 benchmarks/sweep_moe.py --prefill-only --prefill-kinds w8a8,bf16 --prefill-tokens 128,256,1024,4096 \
  --out $OUT/prefill_tiles.json > $OUT/prefill_tiles.log 2>&1; echo "tiles rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1,8,32,128 --contexts 512 --variants new,new-fp8,wonly-fp8 \
  --profile new,new-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
tst 0-1 240 $K/test_moe_kernel.py & tst 2-3 240 $T/test_moe_fp8_formats.py & tst 4-5 240 $T/test_moe_fp8_shards.py &
tst 6-7 240 $T/test_fp8_checkpoint.py "-k experts" & tst 8-11 280 $T/test_verify_graph.py & tst 12-15 280 $T/test_mixed_graph.py & wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^T=" $OUT/prefill_tiles.log | cut -c1-110; grep -hE "decode B=|prefill T=|logits" $OUT/bench_moe.log | cut -c1-150
for f in $OUT/t_*.log; do echo "$(basename $f): $(grep -E '^(FAILED|ERROR)' $f | head -5 | cut -c1-300) $(tail -1 $f | cut -c1-120)"; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
