# session 49 c7 (H200): the decode attention unsplit when its (request, KV head) pairs nearly fill the SMs
# (KernelConfig.decode_split_fill 0.9 / 0.45 against 1.0), in whole decode steps, same run, rows twice
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,16,32 --contexts 512,2048 \
  --variants new,fill09,fill045,new2,new-fp8,fill09-fp8,fill045-fp8,new2-fp8 --out $OUT/moe_fill > $OUT/moe_fill.log 2>&1
echo "moe fill rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 8,16,32 --context 2048 \
  --configs fp8 --fp8-variants '{"fill09": {"decode_split_fill": 0.9}, "fill045": {"decode_split_fill": 0.45}, "again": {}}' \
  --out $OUT/fp8_fill > $OUT/fp8_fill.log 2>&1
echo "fp8 fill rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_decode_attention.py > $OUT/t_dec.log 2>&1
echo "decode attention tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_dec.log; grep -hE "decode B=|decode fp8|B=" $OUT/moe_fill.log $OUT/fp8_fill.log | cut -c1-150 | head -70
