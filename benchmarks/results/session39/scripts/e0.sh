# session 39 call 0 (lead): q one-pass + fused split merge, on 2 GPUs (or serially on one)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); mkdir -p $OUT/main $OUT/moe
G1=1; C1=16-31; [ "$NG" -lt 2 ] && G1=0 && C1=0-15
( export CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4
  timeout 90 taskset -c 0-15 python3 benchmarks/bench_fp8_attention.py --out $OUT/main > $OUT/main/fp8_attention.log 2>&1; echo "attn rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 100 taskset -c 0-15 python3 -m pytest -q -m cuda -p no:cacheprovider tests/model_wrapper/test_fa3_fp8_prefill_cuda.py tests/model_wrapper/test_fa3_fp8.py > $OUT/main/fa3_tests.log 2>&1; echo "fa3tests rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --decode-only --no-peer --batches 1,32 --contexts 512 --variants new,attn-fmerge,new2,new-fp8,attn-fmerge-fp8 --out $OUT/moe > $OUT/moe/bench_moe.log 2>&1; echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=4
  timeout 100 taskset -c $C1 python3 -m pytest -q -m cuda -p no:cacheprovider tests/kernels/test_decode_attention.py "tests/model_wrapper/test_cuda_model.py::test_graph_decode_with_the_split_merge_fused_is_bit_equal" > $OUT/main/fmerge_tests.log 2>&1; echo "fmtests rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 200 taskset -c $C1 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8 --configs bf16,fp8 --fp8-variants '{"fm": {"decode_attention_fused_merge": true}, "qkvnorm": {"gemv_add_norm_qkv": true}, "again": {}}' --bf16-variants '{"fm": {"decode_attention_fused_merge": true}, "again": {}}' --out $OUT/main/dec > $OUT/main/bench_fp8_decode_b1.log 2>&1; echo "dec rc=$? $(date +%T)" >> $OUT/rc.txt
  timeout 200 taskset -c $C1 python3 benchmarks/bench_fp8.py --kind channel --prefill-only --out $OUT/main > $OUT/main/bench_fp8_prefill_channel.log 2>&1; echo "prefill rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/rc.txt
grep -E "quantize_q|1 x 4k|4096" $OUT/main/fp8_attention.log | head -8 | cut -c1-200; tail -3 $OUT/main/fa3_tests.log; tail -3 $OUT/main/fmerge_tests.log
grep -E "^decode" $OUT/main/bench_fp8_decode_b1.log | cut -c1-200; grep -h "prefill 4096" $OUT/main/bench_fp8_prefill_channel.log | cut -c1-200; grep -iE "B=|batch" $OUT/moe/bench_moe.log | tail -14 | cut -c1-200
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
