# session 55 c1: the K-looped pipelined FP8 GEMV probe (stream) against the register-tile GEMV at 1 token
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpus.txt
python3 benchmarks/ab_fp8_gemv_stream.py --out $OUT --shapes gate_up+silu,down,o > $OUT/stream.log 2>&1
echo $? > $OUT/rc.txt
