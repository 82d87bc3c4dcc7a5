"""Causal prefill attention alone, Llama-3-8B heads (32 q / 8 kv, head_dim 128): bf16 against FP8 kernels.

    source .gpu/device-setup.sh && source benchmarks/fa3_fp8_env.sh
    python3 benchmarks/bench_fp8_attention.py --out $OUT/fa3fp8

Cases: one request of 1k / 4k / 8k tokens and 4 requests of 1k, nothing cached (the prompt's own K/V).
Arms (each timed alone, the fastest of --repeats loops of --iters calls after a warm-up):
    fa3_bf16_ragged        FlashInfer fa3 over the step's bf16 K/V: today's bf16 prefill
    fa3_bf16_paged         fa3 over a bf16 paged cache (chunked prefill, prefix hits)
    fa2_bf16q_e4m3_paged   fa2 with bf16 q over an e4m3 paged cache: today's FP8-KV prefill
    fa3_e4m3_ragged        fa3 with q, K, V in e4m3 (model_wrapper/attention/fa3_fp8.py), over the step's K/V
    fa3_e4m3_paged         the same over the e4m3 paged cache: the new FP8-KV prefill
    triton_bf16_paged      the project's Triton prefill kernel (kernels/prefill_attention.py), bf16 cache
    triton_bf16q_e4m3_paged  the same kernel over the e4m3 cache (its default prefill_attention.E4M3_MATH)
    triton_e4m3_fp16_vreg, triton_e4m3_bits_vreg  the same with the decode kernel's fp16 modes (fp8_math)
The e4m3 arms are timed on q already in e4m3; quantize_q_ms is fa3_fp8.quantize_q's own time (the one-pass
kernel; ms_with_q_quant adds it), quantize_q_torch_ms its torch path (clamp + cast), cast_only_ms a bare
.to(e4m3) (one kernel; whether it saturates is printed), each in an eager loop (host launches included);
quantize_q_gpu_ms / quantize_q_torch_gpu_ms the two paths' GPU time alone (CUDA-graph replays).
Page size 16 (the engine's default block), pages in random order. K/V scales amax / 448 (per tensor, as a
calibrated cache), q scale 1.0 (fa3_fp8.Q_SCALE).

Per arm: ms, TFLOP/s (causal: 4 * head_dim * heads * sum L(L+1)/2 flops), x fa3_bf16_ragged, and the
output error on a subset of heads (--err-heads) against float64 softmax attention over
    own:  the inputs the kernel actually reads (e4m3-rounded where FP8: q too for the e4m3 arms),
    bf16: the unrounded bf16 inputs (what FP8 costs end to end),
as max |o - ref| / max |ref| and ||o - ref|| / ||ref||. Writes fp8_attention.json and .png under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import graph_ms  # noqa: E402
from benchmarks.bench_forward import timed  # noqa: E402
from benchmarks.common import pyplot  # noqa: E402
from model_wrapper.attention.fa3_fp8 import E4M3, E4M3_MAX, plan_kwargs, quantize_q  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
CASES = {"1x1k": [1024], "1x4k": [4096], "1x8k": [8192], "4x1k": [1024] * 4}
WS = 128 * 1024 * 1024
BASE = "fa3_bf16_ragged"


def causal_flops(lens) -> float:
    return 4.0 * D * HQ * sum(L * (L + 1) / 2 for L in lens)


class Case:
    """One case's inputs: q [T, HQ, D], k, v [T, HKV, D] bf16; their e4m3 copies (q8 with scale 1,
    k8 / v8 with per-tensor scales ks / vs); bf16 and e4m3 paged caches [pages, PAGE, HKV, D] holding
    the same K/V; FlashInfer's page lists (host, int32) and the Triton kernel's metadata (device)."""

    def __init__(self, lens, dev, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        self.lens = lens
        T = sum(lens)
        self.q = torch.randn(T, HQ, D, generator=g, device=dev).to(torch.bfloat16)
        self.k = torch.randn(T, HKV, D, generator=g, device=dev).to(torch.bfloat16)
        self.v = torch.randn(T, HKV, D, generator=g, device=dev).to(torch.bfloat16)
        self.ks = float(self.k.abs().max()) / E4M3_MAX
        self.vs = float(self.v.abs().max()) / E4M3_MAX
        self.q8 = quantize_q(self.q)
        self.k8 = (self.k.float() / self.ks).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        self.v8 = (self.v.float() / self.vs).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        L = torch.tensor(lens, dtype=torch.int64)
        pages = (L + PAGE - 1) // PAGE
        n_pages = int(pages.sum())
        perm = torch.randperm(n_pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        self.qo = torch.zeros(len(lens) + 1, dtype=torch.int32)
        torch.cumsum(L, 0, out=self.qo[1:])
        self.kv_indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
        torch.cumsum(pages, 0, out=self.kv_indptr[1:])
        self.kv_indices = perm.to(dev)
        self.last = (L - (pages - 1) * PAGE).to(torch.int32)
        # token t of request r (offset i) sits at page perm[kv_indptr[r] + i // PAGE], row i % PAGE
        slots = []
        for r, n in enumerate(lens):
            i = torch.arange(n)
            slots.append(perm[self.kv_indptr[r] + i // PAGE].long() * PAGE + i % PAGE)
        slots = torch.cat(slots).to(dev)
        self.caches = {}
        for name, kk, vv in (("bf16", self.k, self.v), ("e4m3", self.k8, self.v8)):
            kc = torch.zeros(n_pages, PAGE, HKV, D, dtype=kk.dtype, device=dev)
            vc = torch.zeros_like(kc)
            kc.view(torch.uint8).view(-1, HKV, D * kk.element_size()).index_copy_(
                0, slots, kk.view(torch.uint8).reshape(T, HKV, -1))
            vc.view(torch.uint8).view(-1, HKV, D * kk.element_size()).index_copy_(
                0, slots, vv.view(torch.uint8).reshape(T, HKV, -1))
            self.caches[name] = (kc, vc)
        self.T = T


def arms(case: Case, dev):
    """name -> (setup() -> run(), q dtype): setup plans (and loads the kernel), run computes [T, HQ, D]."""
    import flashinfer

    ws = torch.empty(WS, dtype=torch.uint8, device=dev)
    qo_d = case.qo.to(dev)
    one = lambda n, s: torch.full((n,), s, dtype=torch.float32, device=dev)  # noqa: E731
    sq, sk, sv = one(HQ, 1.0), one(HKV, case.ks), one(HKV, case.vs)

    def ragged(backend, q, k, v, kw, args=()):
        def setup():
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(case.qo, case.qo, HQ, HKV, D, causal=True, **kw)
            return lambda: w.run(q, k, v, *args)
        return setup

    def paged(backend, q, cache, kw, args=(), run_kw=None):
        def setup():
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(case.qo, case.kv_indptr, case.kv_indices, case.last, HQ, HKV, D, PAGE, causal=True, **kw)
            return lambda: w.run(q, cache, *args, **(run_kw or {}))
        return setup

    def triton(cache, fp8, fp8_math=None):
        def setup():
            from model_wrapper.kernels.prefill_attention import paged_prefill_attention, tile_map, tile_tokens

            bt = tile_tokens(HQ, HKV)
            tiles = tile_map(case.qo[1:] - case.qo[:-1], case.T, bt).to(dev)
            ind, last = case.kv_indptr.to(dev), case.last.to(dev)
            pos = torch.cat([torch.arange(n) for n in case.lens]).to(dev)
            ks, vs = (one(1, case.ks), one(1, case.vs)) if fp8 else (None, None)
            return lambda: paged_prefill_attention(case.q, *cache, qo_d, ind, case.kv_indices, last, tiles, pos,
                                                   1 / math.sqrt(D), block_t=bt, k_scale=ks, v_scale=vs,
                                                   fp8_math=fp8_math)
        return setup

    bf = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return {
        "fa3_bf16_ragged": (ragged("fa3", case.q, case.k, case.v, bf), "bf16"),
        "fa3_bf16_paged": (paged("fa3", case.q, case.caches["bf16"], bf), "bf16"),
        "fa2_bf16q_e4m3_paged": (paged("fa2", case.q, case.caches["e4m3"],
                                       dict(q_data_type=torch.bfloat16, kv_data_type=E4M3),
                                       run_kw=dict(k_scale=case.ks, v_scale=case.vs)), "bf16q"),
        "fa3_e4m3_ragged": (ragged("fa3", case.q8, case.k8, case.v8, plan_kwargs(torch.bfloat16, None),
                                   (sq, sk, sv)), "e4m3"),
        "fa3_e4m3_paged": (paged("fa3", case.q8, case.caches["e4m3"], plan_kwargs(torch.bfloat16, None),
                                 (sq, sk, sv)), "e4m3"),
        "triton_bf16_paged": (triton(case.caches["bf16"], False), "bf16"),
        "triton_bf16q_e4m3_paged": (triton(case.caches["e4m3"], True), "bf16q"),
        "triton_e4m3_fp16_vreg": (triton(case.caches["e4m3"], True, "fp16_vreg"), "bf16q"),
        "triton_e4m3_bits_vreg": (triton(case.caches["e4m3"], True, "bits_vreg"), "bf16q"),
    }


def reference(case: Case, q, k, v, heads) -> torch.Tensor:
    """float64 causal softmax attention -> [T, len(heads), D] of q [T, HQ, D], k, v [T, HKV, D]
    (any float dtype, already dequantized), each request over its own keys."""
    out = torch.empty(case.T, len(heads), D, dtype=torch.float64, device=q.device)
    group = HQ // HKV
    for r, n in enumerate(case.lens):
        a = int(case.qo[r])
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        for j, h in enumerate(heads):
            qh = q[a:a + n, h].double()
            kh, vh = k[a:a + n, h // group].double(), v[a:a + n, h // group].double()
            s = (qh @ kh.T) / math.sqrt(D)
            s.masked_fill_(~mask, float("-inf"))
            out[a:a + n, j] = torch.softmax(s, -1) @ vh
            del s
    return out


def errors(o, ref) -> dict:
    d = (o.double() - ref)
    return dict(max_rel=float(d.abs().max() / ref.abs().max()), rms_rel=float(d.norm() / ref.norm()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--arms", default=None, help="comma-separated subset of the arms (default: all)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--err-heads", default="0,5,10,15,16,21,26,31", help="q heads whose output error is computed")
    args = ap.parse_args()
    dev = "cuda"
    import flashinfer

    heads = [int(h) for h in args.err_heads.split(",")]
    big = torch.tensor([500.0, -1000.0, 460.0], device=dev, dtype=torch.bfloat16).to(E4M3).float().tolist()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "flashinfer": flashinfer.__version__,
           "heads": [HQ, HKV, D], "page": PAGE, "err_heads": heads, "cases": {},
           "cuda_cast_of_500_-1000_460_to_e4m3": big}  # saturating (448, -448, 448) or NaN: is quantize_q's clamp needed
    print("bf16 -> e4m3 cast of 500, -1000, 460 on this GPU:", big, flush=True)
    first_call = {}
    for ci, cname in enumerate(args.cases.split(",")):
        case = Case(CASES[cname], dev, seed=ci)
        flops = causal_flops(case.lens)
        t_q = timed(lambda: quantize_q(case.q), iters=args.iters, device=dev, repeats=args.repeats)
        t_q2 = timed(lambda: quantize_q(case.q, one_pass=False), iters=args.iters, device=dev, repeats=args.repeats)
        t_cast = timed(lambda: case.q.to(E4M3), iters=args.iters, device=dev, repeats=args.repeats)
        ref_bf16 = reference(case, case.q, case.k, case.v, heads)
        k_deq, v_deq = case.k8.float() * case.ks, case.v8.float() * case.vs
        refs = {"bf16": ref_bf16, "bf16q": reference(case, case.q, k_deq, v_deq, heads),
                "e4m3": reference(case, case.q8.float(), k_deq, v_deq, heads)}
        rows = {"quantize_q_ms": t_q * 1e3, "quantize_q_torch_ms": t_q2 * 1e3, "cast_only_ms": t_cast * 1e3}
        # GPU time alone (replays of 20 calls in a CUDA graph): the eager loop above also times the host's
        # launches (a Triton launch costs more host time than torch's two), which a GPU-bound prefill step hides
        for key, fn in (("quantize_q_gpu_ms", lambda: quantize_q(case.q)),
                        ("quantize_q_torch_gpu_ms", lambda: quantize_q(case.q, one_pass=False))):
            rows[key] = graph_ms(lambda: [fn() for _ in range(20)]) / 20
        for name, (setup, kind) in arms(case, dev).items():
            if args.arms and name not in args.arms.split(","):
                continue
            try:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                run = setup()
                o = run()
                torch.cuda.synchronize()
                first_call.setdefault(name, time.perf_counter() - t0)  # the first case's: JIT build / load
                t = timed(run, iters=args.iters, device=dev, repeats=args.repeats)
                o = run()[:, heads]
                row = dict(ms=t * 1e3, tflops=flops / t / 1e12, err_own=errors(o, refs[kind]),
                           err_vs_bf16_unrounded=errors(o, ref_bf16))
                if kind == "e4m3":
                    row["ms_with_q_quant"] = (t + t_q) * 1e3
            except Exception as e:  # noqa: BLE001 (reported; the other arms stand)
                row = dict(error=f"{type(e).__name__}: {e}"[:1500])
            rows[name] = row
            msg = (f"{row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s  err own {row['err_own']['max_rel']:.2e} "
                   f"(rms {row['err_own']['rms_rel']:.2e})  vs bf16 {row['err_vs_bf16_unrounded']['max_rel']:.2e}"
                   if "ms" in row else row["error"][:300])
            print(f"{cname:5s} {name:24s} {msg}", flush=True)
        base = rows.get(BASE, {}).get("ms")
        for name, row in rows.items():
            if isinstance(row, dict) and "ms" in row and base:
                row["x_fa3_bf16"] = base / row["ms"]
                if "ms_with_q_quant" in row:
                    row["x_fa3_bf16_with_q_quant"] = base / row["ms_with_q_quant"]
        print(f"{cname}: " + ", ".join(f"{n} {r['x_fa3_bf16']:.2f}x" for n, r in rows.items()
                                       if isinstance(r, dict) and "x_fa3_bf16" in r), flush=True)
        res["cases"][cname] = rows
        del case, refs, ref_bf16
        torch.cuda.empty_cache()
    res["first_call_s"] = first_call
    print("first call (plan + run, incl. any JIT build / load), s:", {k: round(v, 2) for k, v in first_call.items()})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_attention.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(args.out, "fp8_attention.png"))


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    cases = list(res["cases"])
    names = sorted({n for c in cases for n, r in res["cases"][c].items() if isinstance(r, dict) and "ms" in r})
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ys = [res["cases"][c].get(n, {}).get("tflops", 0) for c in cases]
        ax.bar([x + i * w for x in range(len(cases))], ys, w, label=n)
    ax.set_xticks([x + 0.4 - w / 2 for x in range(len(cases))], cases)
    ax.set(ylabel="TFLOP/s (causal)", title=f"prefill attention, 32 q / 8 kv heads x 128 ({res['device']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
