# session 47 c7 (H200): the FP8 experts' W8A8 small tiles as W a^T (moe_w8a8_swap: wgmma e4m3 products), with pointer
# loads and with TMA weight tiles: their CUDA tests, then Qwen3-30B-A3B FP8-expert decode at batch 8 / 32 / 128
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "w8a8_cuda" > $OUT/t_moe.log 2>&1
echo "moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new-fp8,swap-fp8,swap-tma-fp8,new2-fp8 --out $OUT/moe_swap > $OUT/moe_swap.log 2>&1
echo "moe swap rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_moe.log; grep -hE "decode B=|logits" $OUT/moe_swap.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
