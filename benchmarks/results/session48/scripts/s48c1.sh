# request for session 48's first device call (an H100: kind nvidia-h100-x1; ~8 min; written in session 47, runs as is
# on main): cp benchmarks/results/session47/scripts/next_s48c1.sh .probe/c1.sh; run "bash .probe/c1.sh" carrying .gpu, .probe
# Session 47 flipped three defaults, measured as follows: fp8_skinny_mma_tma (block weights' tiles through TMA: H200
# and H100), fp8_skinny_mma_max_tokens 16 -> 32 (H200 and H100, against cuBLASLt; DeepGEMM did not build), and
# moe_w8a8_swap (the FP8 experts' W8A8 small tiles as W a^T with TMA tiles: H200 only). This call: the swap on an H100
# (against noswap-fp8), the model-level FP8 CUDA tests under all three, and the block bound's rows once more.
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "w8a8_cuda" > $OUT/t_moe.log 2>&1
echo "moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper/test_fp8_checkpoint.py \
  tests/model_wrapper/test_moe_fp8_formats.py tests/model_wrapper/test_moe_fp8_shards.py > $OUT/t_fp8_models.log 2>&1
echo "fp8 model tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new-fp8,noswap-fp8,new2-fp8 --out $OUT/moe_swap > $OUT/moe_swap.log 2>&1
echo "moe swap rc=$? $(date +%T)" >> $OUT/rc.txt
# the Qwen3-30B-A3B FP8 checkpoint's attention projections at 24-32 tokens: skinny_mma (bound 32) against cuBLASLt (16)
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 16,24,32 --contexts 512 \
  --variants ckpt-m16-fp8,ckpt-fp8 --out $OUT/moe_ckpt > $OUT/moe_ckpt.log 2>&1
echo "moe ckpt rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 16,24,32,48 --configs fp8 \
  --fp8-variants '{"m16": {"fp8_skinny_mma_max_tokens": 16}, "again": {}}' --out $OUT/fp8_block > $OUT/fp8_block.log 2>&1
echo "fp8 block rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_moe.log $OUT/t_fp8_models.log; grep -hE "^decode " $OUT/fp8_*.log
grep -hE "decode B=" $OUT/moe_*.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
