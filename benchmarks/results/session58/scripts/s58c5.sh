# session 58 c5: the per-token SiLU-and-mul + quantize kernel (fp8_silu_row_chunk, new) swept alone, then the
# per-channel 4k prefill with the sweep's two fastest launches against the whole-row kernel (the default), one process
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 taskset -c 0-15 python3 benchmarks/sweep_silu_quant.py --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep rc=$? $(date +%T)" >> $OUT/rc.txt
V=$(python3 -c "
import json; r=json.load(open('$OUT/sweep/silu_quant.json'))['rows']
big=sorted([x for x in r if x['tokens']==4096 and x['config'].get('fp8_silu_row_chunk') and x['same_as_whole_row']], key=lambda x: x['us'])[:2]
print(json.dumps({x['variant']: x['config'] for x in big}))")
echo "variants $V" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --prefill-only --prefill-variants "$V" \
  --out $OUT/pre > $OUT/pre.log 2>&1
echo "pre rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT sweep pre 2>/dev/null; rm -rf $OUT/sweep $OUT/pre
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^T=|best|copy" $OUT/sweep.log; grep -hE "^prefill [0-9]" $OUT/pre.log | cut -c1-200
