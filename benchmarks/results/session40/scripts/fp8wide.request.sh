# fp8wide: 1 GPU (H200 or H100), expected ~4 min (timeouts: tests 100 s, kernel sweep 110 s, step A/B 200 s; most likely ~3.5 min)
source .gpu/device-setup.sh > /dev/null 2>&1; source benchmarks/fa3_fp8_env.sh > /dev/null 2>&1
R=$OUT/fp8wide; mkdir -p $R/step; nvidia-smi --query-gpu=name --format=csv,noheader > $R/device.txt
# 1. kernel tests (CUDA + the small-tile cases compiled for sm90) and the model's CUDA bound tests with the switch
#    forced on (fp8_wide_gate_up True, min tokens 17: the tiny checkpoints' prefills take the kernel), in parallel
( timeout 80 python3 -m pytest -q -p no:cacheprovider -rA tests/kernels/test_fp8_wide.py > $R/kernel_tests.log 2>&1; echo "kernel tests rc=$?" >> $R/rc.txt ) &
mkdir -p /tmp/fw && cp -r . /tmp/fw/tree 2>/dev/null; ( cd /tmp/fw/tree && sed -i 's/fp8_wide_gate_up: bool = False/fp8_wide_gate_up: bool = True/; s/fp8_wide_min_tokens: int = 1024/fp8_wide_min_tokens: int = 17/' model_wrapper/kernels/config.py && grep -n "fp8_wide_gate_up:\|fp8_wide_min_tokens:" model_wrapper/kernels/config.py > $R/model_tests.log && timeout 100 python3 -m pytest -q -p no:cacheprovider -rA -m cuda tests/model_wrapper/test_fp8_checkpoint.py -k "keeps_fp8_weights" >> $R/model_tests.log 2>&1; echo "model tests (switch on) rc=$?" >> $R/rc.txt ) &
wait
# 2. the kernel: config sweep at 4096 tokens, then 4096 / 1024 / 256 against cuBLASLt + silu_and_mul_fp8, and the errors
timeout 110 python3 benchmarks/ab_fp8_wide.py --sweep --out $R > $R/ab_fp8_wide.log 2>&1; echo "ab_fp8_wide rc=$?" >> $R/rc.txt
# 3. the step A/B, 4k prefill of the Llama-3-8B shape, channel FP8: default, +wide, +fast, +wide+fast (the sweep's best config of each accumulation)
B=$(cat $R/fp8_wide_best.json 2>/dev/null || echo '{}'); BF=$(cat $R/fp8_wide_best_fast.json 2>/dev/null || echo '{}')
V=$(python3 -c "import json,sys; b,f=json.loads(sys.argv[1]),json.loads(sys.argv[2]); on={'fp8_wide_gate_up': True}; print(json.dumps({'wide': {**on, **b}, 'fast': {'fp8_fast_accum': True}, 'wide_fast': {**on, **f, 'fp8_fast_accum': True}}))" "$B" "$BF")
echo "variants: $V" > $R/step/bench_fp8_prefill.log
timeout 200 python3 benchmarks/bench_fp8.py --kind channel --prefill-only --prefill-variants "$V" --out $R/step >> $R/step/bench_fp8_prefill.log 2>&1; echo "step A/B rc=$?" >> $R/rc.txt
echo "== fp8wide summary"; cat $R/device.txt $R/rc.txt; tail -3 $R/kernel_tests.log; tail -3 $R/model_tests.log
grep -h "^sweep\|^config\|^T=\|rror" $R/ab_fp8_wide.log; grep -h "prefill 4096" $R/step/bench_fp8_prefill.log | cut -c1-200
