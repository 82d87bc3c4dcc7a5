# session 48 c5 (H200): moe_w8a8_norm_quant (the post-attention add + RMSNorm quantizes x for the FP8 experts' W8A8
# GEMMs: a quantize kernel a layer fewer) -- its kernel test, bench_moe's FP8 decode rows against the default in the
# same run, then the model-level FP8 MoE CUDA tests with the switch on (the default flipped in this copy only), then
# the rest of the CUDA suite under main's defaults for what time is left
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 100 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "norm_quantized" > $OUT/t_nq.log 2>&1
echo "nq kernel test rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new-fp8,nq-fp8,new2-fp8,nq2-fp8,ckpt-fp8,ckpt-nq-fp8 --out $OUT/moe_nq > $OUT/moe_nq.log 2>&1
echo "moe nq rc=$? $(date +%T)" >> $OUT/rc.txt
cp model_wrapper/kernels/config.py /tmp/config.py.main
sed -i 's/    moe_w8a8_norm_quant: bool = False/    moe_w8a8_norm_quant: bool = True/' model_wrapper/kernels/config.py
grep -c "moe_w8a8_norm_quant: bool = True" model_wrapper/kernels/config.py >> $OUT/rc.txt
timeout 130 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper/test_moe_fp8_shards.py \
  tests/model_wrapper/test_moe_fp8_formats.py tests/model_wrapper/test_fp8_checkpoint.py -k "moe or expert or rank" > $OUT/t_models_nq.log 2>&1
echo "model tests (nq on) rc=$? $(date +%T)" >> $OUT/rc.txt
cp /tmp/config.py.main model_wrapper/kernels/config.py
timeout 120 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels -x --ignore=tests/kernels/test_moe_kernel.py > $OUT/t_kernels.log 2>&1
echo "kernel suite rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_nq.log $OUT/t_models_nq.log $OUT/t_kernels.log; grep -h FAILED $OUT/t_*.log | head
grep -hE "decode B=" $OUT/moe_nq.log | cut -c1-150
