"""bench_tp.py's correctness run: one batched prefill + teacher-forced decode steps, on every rank
alike, and the verdict of TP=N's logits against TP=1's and an fp32 reference.

    prompts, tokens = check_inputs(cfg, tiny)         # the same on every rank (fixed seed)
    logits = check_run(gen, kv, prompts, tokens)       # float32 [batch * (1 + steps), vocab] on the CPU
    verdict = correctness(l1, l32, {"graph": .., "eager": .., "eager_again": .., "graph_same": ..},
                          gathered, prompts, tokens, W, fp8)
"""

from __future__ import annotations

import torch

BLOCK_SIZE = 16


def check_inputs(cfg: dict, tiny_model: bool):
    """-> (prompts, decode_tokens [steps][batch]), the same on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(1234)
    lens, steps = ((37, 5, 60, 13), 3) if tiny_model else ((517, 64, 1000, 13), 4)
    prompts = [torch.randint(0, cfg["vocab_size"], (n,), generator=g) for n in lens]
    tokens = torch.randint(0, cfg["vocab_size"], (steps, len(lens)), generator=g)
    return prompts, tokens


def check_blocks(prompts, tokens) -> int:
    return len(prompts) * -(-(max(len(p) for p in prompts) + len(tokens)) // BLOCK_SIZE)


def check_run(gen, kv, prompts, tokens) -> torch.Tensor:
    """Batched prefill (last-token logits), then one decode step per row of tokens; request b on
    blocks [b * per, (b + 1) * per). -> float32 logits [batch * (1 + steps), vocab] on the CPU."""
    B, steps = len(prompts), len(tokens)
    max_len = max(len(p) for p in prompts) + steps
    per = -(-max_len // BLOCK_SIZE)
    tables = torch.arange(B * per, dtype=torch.int32).view(B, per)

    def slots_of(b, pos):
        return tables[b, pos // BLOCK_SIZE].to(torch.int64) * BLOCK_SIZE + pos % BLOCK_SIZE

    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    pos = [torch.arange(n) for n in lens.tolist()]
    out = [gen.forward_tensor(torch.cat(prompts), torch.cat(pos), True, kv, tables,
                              torch.cat([slots_of(b, p) for b, p in enumerate(pos)]), lens, max_len,
                              lm_head_indices=torch.cumsum(lens, 0) - 1)]
    for t in range(steps):
        p = lens.to(torch.int64)
        lens = lens + 1
        out.append(gen.forward_tensor(tokens[t], p, False, kv, tables,
                                      torch.stack([slots_of(b, p[b]) for b in range(B)]), lens, max_len))
    return torch.cat(out).float().cpu()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).float().mean())


def pair_bound(bound: float, ref: torch.Tensor, x: torch.Tensor) -> float:
    """The largest rel_err(y, x) two runs x, y that are each within `bound` (relative to max |ref|)
    of ref can have: max|y - x| <= max|y - ref| + max|x - ref| <= 2 * bound * max|ref|, over
    max|x| (tests/model_wrapper/test_fp8_kv_cuda.py's pair_bound)."""
    return 2 * bound * float(ref.abs().max() / x.abs().max().clamp_min(1e-12))


def split_err(a: torch.Tensor, b: torch.Tensor, batch: int) -> tuple[float, float]:
    """rel_err of check_run's prefill rows (the first `batch`) and of its decode rows (the rest)."""
    return rel_err(a[:batch], b[:batch]), rel_err(a[batch:], b[batch:])


def correctness(l1, l32, runs: dict, gathered, prompts, tokens, W, fp8):
    """The verdict of one all-reduce mode's TP=W runs (check_run's logits, float32 on the CPU):

    runs["graph"]        the real path: default KernelConfig (mixed-step graph for the batched prefill,
                         decode graphs with the Triton decode attention)
    runs["eager"]        no graphs (FlashInfer ragged prefill and decode)
    runs["eager_again"]  the same eager run again (run-to-run determinism of the eager kernels)
    runs["graph_same"]   graphs running the eager kernels on the eager inputs: prefill eager
                         (mixed_graphs off), decode graphs with FlashInfer's decode (triton_decode off);
                         the check's batch (4) is a graph bucket, so no padding rows either

    Pass: the graph run's and the eager run's errors against the fp32 reference each within
    2 x TP=1's own + 2e-3 (hence graph vs eager within pair_bound), ranks identical, and the
    same-kernels graph bit-identical to eager (graph_eq_eager)."""
    B = len(prompts)
    lw, le = runs["graph"], runs["eager"]
    e1, ew, ee = rel_err(l1, l32), rel_err(lw, l32), rel_err(le, l32)
    bound = 2 * e1 + 2e-3
    what = "fp8" if fp8 else "bf16"
    same = runs["graph_same"]
    return {
        "reference": ("fp32 TP=1 model of the same checkpoint" + (" (FP8 weights dequantized: w * scale)" if fp8 else "")
                      + ", torch attention backend, no graphs"),
        "inputs": (f"batched prefill of {B} prompts ({', '.join(str(len(p)) for p in prompts)} tokens, "
                   f"last-token logits) + {len(tokens)} teacher-forced decode steps (CUDA-graph replays where "
                   "available)"),
        "rows": int(l1.shape[0]),
        "metric": "max |logits - fp32 logits| / max |fp32 logits| over all rows",
        f"tp1_{what}_err": e1, f"tp{W}_{what}_err": ew, f"tp{W}_eager_{what}_err": ee,
        "bound": bound, "pass": ew <= bound and ee <= bound,
        f"tp{W}_vs_tp1": rel_err(lw, l1),
        "top1_tp1_vs_fp32": top1(l1, l32), f"top1_tp{W}_vs_fp32": top1(lw, l32), f"top1_tp{W}_vs_tp1": top1(lw, l1),
        "ranks_identical": all(torch.equal(g, gathered[0]) for g in gathered),
        # the real path against eager: different prefill kernels (Triton varlen in the mixed graph
        # against FlashInfer's ragged prefill) and decode attention, so a bf16 rounding apart that a
        # random 2-layer model amplifies (FP8 activation scales, MoE router near-ties); held to the
        # pair bound that both runs' own bounds imply
        f"tp{W}_graph_vs_eager": rel_err(lw, le),
        f"tp{W}_graph_vs_eager_prefill_decode": split_err(lw, le, B),
        "pair_bound": pair_bound(bound, l32, le),
        "eager_deterministic": torch.equal(le, runs["eager_again"]),
        f"tp{W}_same_kernels_graph_vs_eager": rel_err(same, le),
        f"tp{W}_same_kernels_prefill_decode": split_err(same, le, B),
        "graph_eq_eager": torch.equal(same, le),
    }
