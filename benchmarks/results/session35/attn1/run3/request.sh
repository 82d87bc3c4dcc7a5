# attn1 run 3: 1 GPU, about 4 minutes at most (timeouts 25 + 80 + 90 + 45 s). Branch h/s35-attn1 (worktree
# /work/wt/attn1), HEAD b7abc85 or later.
# 1. Diagnosis of bench_moe's "rope-* logits B=1 ... 5.75e-01 against new" (bf16 MoE only, FP8-expert rows bit-equal):
#    the model tests against transformers (graphs: Llama, Qwen3, Qwen3-MoE, Mistral window; B 1/2; e4m3 graphs + eager),
#    and bench_moe's check against new2 = new run again after the rope rows (is it the variant or the run's order?).
# 2. A/B at B=1: early-pf = page metadata before the PDL wait + first K/V tile prefetched into L2 (unfused path);
#    rope-tile / ra-tile = the fused kernel with its first K/V tile loaded before the wait (new since run 2).
mkdir -p $OUT/attn1
timeout 25 python3 -m pytest -q -p no:cacheprovider -m cuda tests/kernels/test_rope_decode_attention.py \
  -k "repeated or tile" -x 2>&1 | tail -8 | tee $OUT/attn1/kernel_tests.log
timeout 80 python3 -m pytest -q -p no:cacheprovider -m cuda -s tests/model_wrapper/test_rope_attention_cuda.py 2>&1 \
  | grep -E "fused|passed|failed|Error|assert" | tail -40 | tee $OUT/attn1/model_tests.log
timeout 90 python3 benchmarks/bench_moe.py --out $OUT/attn1 --decode-only --no-peer --batches 1 --contexts 512 \
  --variants new,rope-tile,early-pf,new2,new-fp8,early-pf-fp8,rope-tile-fp8 2>&1 | grep -v " INFO " \
  | tee $OUT/attn1/moe.log | grep -E "decode B=|logits B=|rror"
V='{"early-pf": {"decode_attention_early_meta": true, "decode_attention_prefetch": true}, "ra-tile": {"decode_rope_attention_max_batch": 2, "decode_attention_early_meta": true, "decode_rope_attention_early_tile": true}, "base2": {}}'
timeout 45 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 --fp8-variants "$V" \
  --out $OUT/attn1 2>&1 | grep -v " INFO " | tee $OUT/attn1/fp8_decode.log | grep -E "^decode|rror"
