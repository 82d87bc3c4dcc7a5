timeout 130 python3 .probe/fastacc.py > $OUTJ/fastacc.log 2>&1
timeout 160 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2 --configs fp8,bf16 --fp8-variants '{"qkvnorm": {"gemv_add_norm_qkv": true}, "default2": {}}' --bf16-variants '{"qkvnorm": {"gemv_add_norm_qkv": true}, "default2": {}}' --out $OUTJ > $OUTJ/qkvnorm.log 2>&1
