# session 43, c8 (one GPU, any card): block weights' scales loaded a K step ahead in fp8_skinny_mma
# (fp8_skinny_mma_scales_ahead, new default): CUDA tests, then the decode-step A/B at batch 4 / 8 / 16 (Llama-3-8B)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 150 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_fp8_kernels.py \
  tests/kernels/test_fp8_act.py tests/model_wrapper/test_fp8_checkpoint.py -k "skinny_mma or every_path or block" \
  > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"in-step": {"fp8_skinny_mma_scales_ahead": false}, "again": {}}'
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 4,8,16 --configs fp8 \
  --fp8-variants "$V" --out $OUT/ahead > $OUT/ahead.log 2>&1; echo "ahead rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "PASSED|FAILED|ERROR" $OUT/t.log | sed 's/.*:://' | cut -c1-110; grep -hE "^decode " $OUT/ahead.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
