# session 44 c13: test_fp8_experts_w8a8_cuda with its decode bound moved for FP8 experts too (moe_fp8_decode_pairs 0:
# at 3 tokens the W8A8 sorted path, as the test intends; c12 ran it at the new default bound, 32 pairs, where 3 tokens
# take the weight-only decode GEMVs)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 200 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_moe_kernel.py \
  -k "w8a8_cuda or fp8_experts_match_reference_cuda" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -12
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
