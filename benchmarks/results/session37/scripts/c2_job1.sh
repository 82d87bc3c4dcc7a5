timeout 300 python3 benchmarks/bench_fp8.py --skip-accuracy --engine-prompts 256 --out $OUTJ > $OUTJ/bench_fp8.log 2>&1
