# session 48 c2: the W8A8 experts' error swapped / unswapped against the oracle and the exact product (the shard
# test's failures in c1), then the MoE model tests and kernel tests under the defaults on this card
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
cp .probe/test_s48_errs.py tests/kernels/
timeout 300 taskset -c 0-15 python3 -m pytest -q -s -m cuda tests/kernels/test_s48_errs.py > $OUT/errs.log 2>&1
echo "errs rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -x -k "w8a8 or swap or tma" > $OUT/t_moe.log 2>&1
echo "moe kernel tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_moe.log
python3 - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.path.join(os.environ["OUT"], "errs.jsonl"))]
for r in rows:
    print(r["H"], r["I"], r["E"], r["k"], r["T"], r["seed"], "oracle %.4f/%.4f" % tuple(r["oracle_vs_exact"]),
          *("%s o %.4f/%.4f e %.4f/%.4f" % (n, *r[n]["vs_oracle"], *r[n]["vs_exact"]) for n in ("swap", "noswap", "weight_only")))
PY
