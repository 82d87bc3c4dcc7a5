# session 41 call c6: the split decode attention merged by its last program (decode_attention_fused_merge) against the
# merge kernel: its CUDA tests, Llama-3-8B FP8 decode at batch 1 / 8 (block weights, bf16 and FP8 KV), Qwen3-30B-A3B
# decode at batch 1 / 8 (bf16 and FP8 experts); the Triton version the GPU machine's torch brings
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 120 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/kernels/test_decode_attention.py \
  > $OUT/t_decode_attention.log 2>&1; echo "t_decode rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"fm": {"decode_attention_fused_merge": true}, "again": {}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 1,8 --configs fp8,fp8+fp8kv \
  --fp8-variants "$V" --fp8kv-variants "$V" --out $OUT/fm_dense > $OUT/fm_dense.log 2>&1; echo "fm_dense rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8 --contexts 512 \
  --variants new,fmerge,new-fp8,fmerge-fp8 --out $OUT/fm_moe > $OUT/fm_moe.log 2>&1; echo "fm_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -h "^decode" $OUT/fm_dense.log | cut -c1-120; grep -hE "decode B=|logits" $OUT/fm_moe.log | cut -c1-130
grep -E "^(FAILED|ERROR)" $OUT/t_decode_attention.log | head -5 | cut -c1-200; tail -1 $OUT/t_decode_attention.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
