# session 46 c2: where Qwen3-30B-A3B's 4k prefill goes (bf16 75 ms, FP8 experts 87, + block-FP8 attention 101 on the H200
# in c1), and the grouped GEMM's prefill tiles beside torch.bmm on balanced groups
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 \
  --variants new,new-fp8,ckpt-fp8 --profile-prefill new,new-fp8,ckpt-fp8 --out $OUT/moe_pf > $OUT/moe_pf.log 2>&1
echo "moe pf rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 300 taskset -c 0-15 python3 benchmarks/sweep_moe.py --prefill-only --prefill-kinds bf16,w8a8 --prefill-tokens 1024,4096 \
  --prefill-tiles '[[128,128,64,8,3],[128,128,64,8,4],[128,128,32,8,4],[128,128,32,8,5],[128,64,64,4,4],[128,64,64,8,4],[64,128,64,4,4],[64,128,64,4,3],[64,64,64,4,4],[256,64,64,8,3],[64,256,64,8,3],[64,64,128,4,3],[128,64,128,8,3],[128,64,128,4,3]]' \
  --out $OUT/tiles/moe_sweep.json > $OUT/tiles.log 2>&1
echo "tiles rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -vE "^copy|^model|^KV|peak" $OUT/moe_pf.log | cut -c1-170; grep -E "^T=" $OUT/tiles.log | cut -c1-140
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
