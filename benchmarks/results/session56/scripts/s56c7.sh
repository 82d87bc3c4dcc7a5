# session 56 c7: moe_gemv_n_first (the decode path's expert GEMVs numbered column block first) against the default:
# Qwen3-30B-A3B decode at batch 1 / 2 / 4 (ctx 512), bf16 and FP8 experts, off / on / off again / on again (FP8)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"gn":{"moe_gemv_n_first":true},"again":{},"gn-fp8":{"moe_gemv_n_first":true},"again-fp8":{},"gn2-fp8":{"moe_gemv_n_first":true}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,4 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|logit" $OUT/moe.log | grep -v 'against new,' | cut -c1-110
