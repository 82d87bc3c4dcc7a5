# session 41 call c2: the MoE prefill tiles of bf16 / FP8 weight-only / W8A8 experts (sweep_moe --prefill-only);
# skinny_mma at 17-64 tokens (fp8_skinny_mma_max_tokens 32 / 64) against cuBLASLt, block and per-channel; the FP8
# experts' model test (W8A8 and weight-only)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
CUDA_VISIBLE_DEVICES=0 timeout 170 taskset -c 0-15 python3 benchmarks/sweep_moe.py --prefill-only --prefill-kinds bf16,fp8,w8a8 \
  --prefill-tokens 1024,4096 --out $OUT/prefill_tiles.json > $OUT/prefill_tiles.log 2>&1; echo "tiles rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"mma32": {"fp8_skinny_mma_max_tokens": 32}, "mma64": {"fp8_skinny_mma_max_tokens": 64}}'
for k in block channel; do
  CUDA_VISIBLE_DEVICES=0 timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind $k --decode-only --batches 32,64 --configs fp8 \
    --fp8-variants "$V" --out $OUT/mma_$k > $OUT/mma_$k.log 2>&1; echo "mma_$k rc=$? $(date +%T)" >> $OUT/rc.txt
done
CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
  tests/model_wrapper/test_fp8_checkpoint.py -k experts > $OUT/t_fp8_experts.log 2>&1; echo "t_experts rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^T=" $OUT/prefill_tiles.log | cut -c1-140; grep -h "^decode" $OUT/mma_*.log | cut -c1-150
tail -3 $OUT/t_fp8_experts.log | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
