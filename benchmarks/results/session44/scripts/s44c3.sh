# session 44 c3: the decode attention's split merge inside its kernel (decode_attention_fused_merge) against the merge
# kernel: 1. its kernel tests and the graph test on CUDA; 2. dense decode steps at batch 1 / 2 / 4 / 8 (bf16, FP8
# per-channel), rows twice; 3. the MoE model (Qwen3-30B-A3B shape) at batch 1 / 8, bf16 and FP8 experts
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
OMP_NUM_THREADS=8 timeout 240 taskset -c 0-15 python3 -m pytest -v -p no:cacheprovider -m cuda tests/kernels/test_decode_attention.py \
  tests/model_wrapper/test_cuda_model.py -k "fused or pdl or graph_replay_equals or direct_softmax" > $OUT/t.log 2>&1; echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
F='"decode_attention_fused_merge": true'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1,2,4,8 --configs bf16,fp8 \
  --fp8-variants "{\"fused\": {$F}, \"base2\": {}, \"fused2\": {$F}}" --bf16-variants "{\"fused\": {$F}}" \
  --out $OUT/fp8 > $OUT/fp8.log 2>&1; echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8 --contexts 512 \
  --variants new,fused-merge,new2,new-fp8,fused-merge-fp8 --out $OUT/moe > $OUT/bench_moe.log 2>&1; echo "bench_moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "FAILED|ERROR|passed|failed" $OUT/t.log | tail -8
grep -hE "^decode " $OUT/fp8.log; grep -hE "decode B=" $OUT/bench_moe.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
