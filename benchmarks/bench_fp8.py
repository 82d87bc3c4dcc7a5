"""FP8 weights and the FP8 KV cache on a Llama-3-8B-shaped model, against bf16, in one run.

    source .gpu/device-setup.sh && python3 benchmarks/bench_fp8.py --out benchmarks/results
    python benchmarks/bench_fp8.py --device cpu --tiny --out /tmp/fp8   # smoke run (CPU: no FP8 kernels)

Two generators with the same function: one random bf16 model whose decoder projections are
quantized to e4m3 (--kind block: a scale per 128 x 128 block, as transformers' fine-grained FP8
checkpoints; channel: a scale per output row, as compressed-tensors FP8-dynamic) and kept FP8
(Fp8Method), and a bf16 model holding the *dequantized* weights (so the two differ only by how
they compute). The embedding and lm_head stay bf16 in both, as FP8 checkpoints ship them.

1. accuracy: prefill logits over --acc-tokens positions of random prompts, FP8 and bf16 each
   against float32 on the same dequantized weights (and FP8 against bf16): top-1 agreement and
   mean KL(reference || model). Random weights give near-flat logits, so bf16's own row is the
   yardstick for FP8's;
2. decode step at batch 1 / 8 / 32 / 128 (ctx 512, CUDA graphs): FP8 weights with a bf16 cache,
   FP8 weights with an FP8 cache, and bf16; floor = (weight bytes + scales + KV bytes) / copy
   bandwidth measured here;
3. prefill of 4k tokens: FP8 vs bf16, beside the FP8 GEMM chain of the same shapes
   (torch._scaled_mm with per-row scales: cuBLASLt FP8; with --kind block also its block-scaled
   GEMM, where torch takes block scales) and the bf16 chain;
4. the engine (LLMEngine, --engine-prompts prompts of 512 in / 128 out, greedy): FP8 weights +
   FP8 KV against bf16 weights + bf16 KV, output tokens/s.
Part 3 also times FP8 weights over an FP8 (e4m3) KV cache, its attention on fa2 and on fa3 all-e4m3
(KernelConfig.fp8_kv_prefill), and FP8 with the activation quantization unfused (KernelConfig.fp8_fused_act_quant and
fp8_fused_act_quant_per_token off: a quantize kernel per linear, the A/B baseline of kernels/fp8_act.py);
--prefill-only runs it
alone, --profile-prefill adds each model's top CUDA kernels of one step (and each --prefill-variants row's),
--prefill-tokens sets its prompt length (a step of up to KernelConfig.mixed_max_tokens replays a mixed graph).
Writes fp8.json and fp8.png to --out. --decode-only runs part 2 alone (--batches, --configs pick
its rows; --fp8-variants adds FP8 rows under other KernelConfig values, e.g. the GEMV's, and
--bf16-variants bf16 rows):

    python3 benchmarks/bench_fp8.py --decode-only --batches 1,2,4 --configs bf16,fp8 \
        --fp8-variants '{"tile16k": {"fp8_gemv_tile": 16384}}' --out $OUT
    python3 benchmarks/bench_fp8.py --decode-only --batches 1,2 --configs bf16,fp8 \
        --fp8-variants '{"addnorm": {"gemv_add_norm": true}}' \
        --bf16-variants '{"addnorm": {"gemv_add_norm": true}}' --out $OUT

--prefill-variants adds FP8 prefill rows (part 3) under other KernelConfig values, and their accuracy
(part 1) where it runs; e.g. accuracy and prefill alone (no decode rows, no engine), per-channel scales:

    python3 benchmarks/bench_fp8.py --kind channel --configs none --skip-engine --acc-tokens 2048 \
        --prefill-variants '{"fast": {"fp8_fast_accum": true}, "pertoken": {"fp8_fused_act_quant_per_token": true}}'
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_forward import copy_bandwidth, decode_step, gemm_chain, prefill_step, timed  # noqa: E402
from benchmarks.common import (LLAMA3_8B, count_triton_compiles, linear_to_fp8, pyplot,  # noqa: E402
                               random_text_generator, tiny)

E4M3 = torch.float8_e4m3fn


def to_fp8(gen_fp8, gen_ref, kind: str) -> int:
    """Quantize gen_fp8's decoder projections in place to FP8 (Fp8Method) and give gen_ref the
    dequantized weights; -> bytes of the FP8 weights and scales."""
    ref = gen_ref.model_wrapper.lora_linears()
    nbytes = 0
    for key, lin in gen_fp8.model_wrapper.lora_linears().items():
        dtype = lin.weight.dtype
        nbytes += linear_to_fp8(lin, kind)
        ref[key].weight.data.copy_(lin.method.dequantized(lin, dtype))
    return nbytes


def other_bytes(gen) -> int:
    """Bytes a decode step reads besides the decoder projections: norms and lm_head (not the embedding)."""
    proj = {id(p) for lin in gen.model_wrapper.lora_linears().values() for p in lin.parameters()}
    return sum(p.numel() * p.element_size() for n, p in gen.model_wrapper.model.named_parameters()
               if id(p) not in proj and "embed_tokens" not in n)


def accuracy(gens: dict, ref, cfg, tokens: int) -> dict:
    """Top-1 agreement with ref and mean KL(ref || gen) of each generator's prefill logits over
    random prompts of 512 tokens (every position): {name: {...}}."""
    T = min(512, tokens)
    n = max(1, tokens // T)
    bs = 16
    per = -(-T // bs)
    caches = {name: g.allocate_kv_cache(per + 1, bs) for name, g in gens.items()}
    kv_ref = ref.allocate_kv_cache(per + 1, bs)
    out = {name: dict(positions=0, top1_agreement=0.0, mean_kl=0.0) for name in gens}
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        ids = torch.randint(0, cfg["vocab_size"], (T,), generator=g)
        pos = torch.arange(T)
        tables = torch.arange(per, dtype=torch.int32).view(1, per)
        slots = tables[0, pos // bs].to(torch.int64) * bs + pos % bs
        lens = torch.tensor([T], dtype=torch.int32)
        r = ref.forward_tensor(ids, pos, True, kv_ref, tables, slots, lens, T, lm_head_indices=pos).float()
        lp = torch.log_softmax(r, -1)
        for name, gen in gens.items():
            a = gen.forward_tensor(ids, pos, True, caches[name], tables, slots, lens, T, lm_head_indices=pos).float()
            o = out[name]
            o["top1_agreement"] += int((a.argmax(-1) == r.argmax(-1)).sum())
            o["mean_kl"] += float((lp.exp() * (lp - torch.log_softmax(a, -1))).sum(-1).sum())
            o["positions"] += T
    for o in out.values():
        o["top1_agreement"] /= o["positions"]
        o["mean_kl"] /= o["positions"]
    return out


def fp32_copy(gen_ref, gen8, cfg, device):
    """A float32 generator with gen_ref's weights (the dequantized FP8 ones and its bf16 others) upcast."""
    g32 = random_text_generator(cfg, device=device, dtype=torch.float32, attention_backend="torch", cuda_graphs=False)
    src = dict(gen_ref.model_wrapper.model.named_parameters())
    for name, p in g32.model_wrapper.model.named_parameters():
        p.data.copy_(src[name].data.float())
    return g32


def fp8_gemm_chain(cfg, T, device, iters, blocks=False):
    """Seconds of the decoder's GEMMs in FP8 at T tokens (cuBLASLt via torch._scaled_mm, per-row
    scales: the best FP8 GEMM a peer gets from torch; blocks: its 1 x 128 / 128 x 128 block-scaled
    GEMM, the "scaled_mm_block" path's), activations quantized beforehand, plus the bf16 lm_head
    of one row."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hd = h // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd
    shapes = [(h, qkv), (cfg["num_attention_heads"] * hd, h), (h, 2 * i), (i, h)]
    xs = {k: torch.randn(T, k, device=device).to(E4M3) for k, _ in shapes}
    ws = [torch.randn(n, k, device=device).to(E4M3) for k, n in shapes]
    if blocks:
        sas = {k: torch.ones(k // 128, T, device=device).t() for k, _ in shapes}
        sbs = [torch.ones(n // 128, k // 128, device=device).t() for k, n in shapes]
    else:
        sas = {k: torch.ones(T, 1, device=device) for k, _ in shapes}
        sbs = [torch.ones(1, n, device=device) for _, n in shapes]
    lm = torch.randn(cfg["vocab_size"], h, dtype=torch.bfloat16, device=device)
    xl = torch.randn(1, h, dtype=torch.bfloat16, device=device)

    def chain():
        for _ in range(cfg["num_hidden_layers"]):
            for (k, _), w, sb in zip(shapes, ws, sbs):
                torch._scaled_mm(xs[k], w.t(), scale_a=sas[k], scale_b=sb, out_dtype=torch.bfloat16)
        torch.nn.functional.linear(xl, lm)

    return timed(chain, iters=iters, device=device)


def run_engine(gen, kv_dtype, prompts, out_len, device) -> dict:
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams
    from text_generator.serve.warmup import warm_up

    bs = 16
    max_len = len(prompts[0]) + out_len
    # room for 128 running requests (the same count for both caches: a throughput, not capacity, test)
    num_blocks = -(-max_len // bs) * min(len(prompts), 128) + 1
    kw = {} if kv_dtype is None else dict(kv_cache_dtype=kv_dtype)
    engine = LLMEngine(gen, num_blocks=num_blocks, block_size=bs, max_num_seqs=128, max_num_batched_tokens=4096,
                       max_seq_len=max_len, **kw)
    params = SamplingParams(temperature=0.0, max_new_tokens=out_len, ignore_eos=True)
    # the server's start-up pass: every decode-graph bucket and mixed-step graph captured, every kernel
    # compiled before the clock starts (a 4-prompt warm-up left the timed run capturing a bucket each time
    # its batch shrank: 0.52x "FP8 against bf16" on an H100, the captures, not the steps)
    warm_up(engine)
    if device == "cuda":
        torch.cuda.synchronize()
    compiles, restore = count_triton_compiles() if device == "cuda" else ([], None)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    if device == "cuda":
        torch.cuda.synchronize()
    el = time.perf_counter() - t0
    if restore is not None:
        restore()
    n = sum(len(o.token_ids) for o in outs)
    # compiles_in_timed_pass: Triton kernel specializations first built inside the timed pass (compiled, ~0.5-1.5 s
    # each, or loaded from Triton's disk cache): what the start-up pass did not reach
    res = dict(num_blocks=num_blocks, output_tokens=n, seconds=el, tokens_per_s=n / el,
               compiles_in_timed_pass=compiles)
    del engine
    gc.collect()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--kind", default="block", choices=["block", "channel"])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--acc-tokens", type=int, default=4096)
    ap.add_argument("--engine-prompts", type=int, default=256)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--kernel-config", default=None,
                    help="JSON file of KernelConfig fields to override (benchmarks/pick_fp8_config.py writes one)")
    ap.add_argument("--decode-only", action="store_true", help="the decode rows alone (no accuracy, prefill, engine)")
    ap.add_argument("--batches", default=None, help="comma-separated decode batch sizes (default 1,8,32,128)")
    ap.add_argument("--context", type=int, default=None, help="the decode rows' context in tokens (default 512)")
    ap.add_argument("--configs", default="bf16,fp8,fp8+fp8kv", help="comma-separated decode rows: bf16, fp8, fp8+fp8kv")
    ap.add_argument("--prefill-only", action="store_true",
                    help="the prefill rows alone: bf16, FP8 with the fused activation quantization and without")
    ap.add_argument("--prefill-tokens", type=int, default=None, help="part 3's prompt length (default 4096)")
    ap.add_argument("--profile-prefill", action="store_true",
                    help="with the prefill rows: each model's top CUDA kernels of one step (torch.profiler)")
    ap.add_argument("--fp8-variants", default=None,
                    help='JSON {name: {KernelConfig field: value}}: more FP8-weight decode rows ("fp8[name]")')
    ap.add_argument("--prefill-variants", default=None,
                    help='JSON {name: {KernelConfig field: value}}: more FP8 prefill rows ("fp8[name]"), and their '
                         'accuracy where the accuracy part runs (e.g. fp8_fast_accum, fp8_fused_act_quant_per_token)')
    ap.add_argument("--fp8kv-variants", default=None,
                    help='JSON {name: {KernelConfig field: value}}: more FP8-weight + FP8-KV decode rows ("fp8+fp8kv[name]")')
    ap.add_argument("--bf16-variants", default=None,
                    help='JSON {name: {KernelConfig field: value}}: more bf16 decode rows ("bf16[name]")')
    args = ap.parse_args()
    if args.decode_only or args.prefill_only:
        args.skip_accuracy = args.skip_engine = True
    dev = args.device
    cfg = tiny(LLAMA3_8B) if args.tiny else LLAMA3_8B
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    batches = [1, 8, 32, 128] if not args.tiny else [1, 4]
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    ctx = args.context or (512 if not args.tiny else 64)
    T_pre = args.prefill_tokens or (4096 if not args.tiny else 128)
    iters = 30 if dev == "cuda" else 2
    bs = 16
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
           "model": ("Llama-3-8B-shaped" if not args.tiny else "tiny") + f", random, FP8 {args.kind} scales",
           "kind": args.kind, "context": ctx, "block_size": bs}
    bw = copy_bandwidth(dev)
    res["copy_bandwidth_TBps"] = bw / 1e12
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)

    gen8 = random_text_generator(cfg, device=dev, dtype=dtype)
    genr = random_text_generator(cfg, device=dev, dtype=dtype)
    import dataclasses

    from model_wrapper.kernels import KernelConfig

    base_cfg = KernelConfig()
    if args.kernel_config:
        with open(args.kernel_config) as f:
            overrides = json.load(f)
        res["kernel_config_overrides"] = overrides
        base_cfg = dataclasses.replace(base_cfg, **overrides)
        for gen in (gen8, genr):
            gen.model_wrapper.set_kernel_config(base_cfg)
    variants = json.loads(args.fp8_variants) if args.fp8_variants else {}
    if variants:
        res["fp8_variants"] = variants
    prefill_variants = json.loads(args.prefill_variants) if args.prefill_variants else {}
    if prefill_variants:
        res["prefill_variants"] = prefill_variants
    bf16_variants = json.loads(args.bf16_variants) if args.bf16_variants else {}
    fp8kv_variants = json.loads(args.fp8kv_variants) if args.fp8kv_variants else {}
    if fp8kv_variants:
        res["fp8kv_variants"] = fp8kv_variants
    if bf16_variants:
        res["bf16_variants"] = bf16_variants
    fp8_bytes = to_fp8(gen8, genr, args.kind)
    rest = other_bytes(genr)
    proj_bf16 = sum(p.numel() * p.element_size() for lin in genr.model_wrapper.lora_linears().values()
                    for p in lin.parameters())
    res["weights_GB"] = dict(fp8=(fp8_bytes + rest) / 1e9, bf16=(proj_bf16 + rest) / 1e9)
    print(f"weights read per step: fp8 {(fp8_bytes + rest) / 1e9:.2f} GB, bf16 {(proj_bf16 + rest) / 1e9:.2f} GB",
          flush=True)

    # both against float32 on the same (dequantized) weights: what FP8 costs beside bf16's own rounding
    if not args.skip_accuracy:
        g32 = fp32_copy(genr, gen8, cfg, dev)
        acc = accuracy({"fp8": gen8, "bf16": genr}, g32, cfg, args.acc_tokens if not args.tiny else 128)
        acc["fp8_vs_bf16"] = accuracy({"fp8": gen8}, genr, cfg, args.acc_tokens if not args.tiny else 128)["fp8"]
        for vname, over in prefill_variants.items():  # the same prompts under each variant's config
            gen8.model_wrapper.set_kernel_config(dataclasses.replace(base_cfg, **over))
            acc[f"fp8[{vname}]"] = accuracy({"fp8": gen8}, g32, cfg, args.acc_tokens if not args.tiny else 128)["fp8"]
        gen8.model_wrapper.set_kernel_config(base_cfg)
        res["accuracy"] = acc
        print("accuracy (reference: fp32 on the dequantized weights)", acc, flush=True)
        del g32
    gc.collect()
    torch.cuda.empty_cache() if dev == "cuda" else None

    kv_tok = gen8.kv_cache_spec.bytes_per_token  # bf16 cache bytes per token
    num_blocks = max(batches) * -(-ctx // bs) + 8
    perm = torch.randperm(num_blocks)
    caches = {"bf16": (genr, None, proj_bf16 + rest, kv_tok), "fp8": (gen8, None, fp8_bytes + rest, kv_tok),
              "fp8+fp8kv": (gen8, E4M3, fp8_bytes + rest, kv_tok // 2)}
    caches = {k: v for k, v in caches.items() if k in args.configs.split(",") and not args.prefill_only}
    for vname in bf16_variants:
        caches[f"bf16[{vname}]"] = (genr, None, proj_bf16 + rest, kv_tok)
    for vname in variants:
        caches[f"fp8[{vname}]"] = (gen8, None, fp8_bytes + rest, kv_tok)
    for vname in fp8kv_variants:
        caches[f"fp8+fp8kv[{vname}]"] = (gen8, E4M3, fp8_bytes + rest, kv_tok // 2)
    decode = []
    for name, (gen, kvd, wbytes, kvb) in caches.items():
        # its variant's config, or the run's own
        vname = name[name.index("[") + 1:-1] if "[" in name else None
        table = fp8kv_variants if name.startswith("fp8+fp8kv[") else variants if gen is gen8 else bf16_variants
        gen.model_wrapper.set_kernel_config(dataclasses.replace(base_cfg, **table[vname]) if vname else base_cfg)
        kv = gen.allocate_kv_cache(num_blocks, bs) if kvd is None else gen.allocate_kv_cache(num_blocks, bs, dtype=kvd)
        for B in batches:
            t = timed(decode_step(gen, kv, bs, B, ctx, perm), iters=iters, warmup=3, device=dev, repeats=3)
            floor = (wbytes + B * ctx * kvb) / bw
            decode.append(dict(config=name, batch=B, step_ms=t * 1e3, floor_ms=floor * 1e3, ratio=t / floor))
            print(f"decode {name:10s} B={B:4d}: {t * 1e3:7.3f} ms  floor {floor * 1e3:6.3f}  x{t / floor:.3f}", flush=True)
        del kv
    for d in decode:
        base = next((x for x in decode if x["config"] == "bf16" and x["batch"] == d["batch"]), None)
        if base is not None:
            d["speedup_vs_bf16"] = base["step_ms"] / d["step_ms"]
    res["decode"] = decode
    gen8.model_wrapper.set_kernel_config(base_cfg)
    genr.model_wrapper.set_kernel_config(base_cfg)
    if args.decode_only:
        return save(res, args)

    per = -(-T_pre // bs)
    kv8, kvr = gen8.allocate_kv_cache(per + 1, bs), genr.allocate_kv_cache(per + 1, bs)
    n = 4 if dev == "cuda" else 1
    reps = 3 if dev == "cuda" else 1
    step8, stepr = (prefill_step(g_, kv_, bs, T_pre, torch.arange(per + 1)) for g_, kv_ in ((gen8, kv8), (genr, kvr)))
    tr = timed(stepr, iters=n, device=dev, repeats=reps)
    # A/B: the activation quantization as a kernel per linear (before kernels/fp8_act.py's fusion) first,
    # so that a failure of the fused path still leaves the baseline
    gen8.model_wrapper.set_kernel_config(dataclasses.replace(base_cfg, fp8_fused_act_quant=False,
                                                             fp8_fused_act_quant_per_token=False))
    t8_unfused = timed(step8, iters=n, device=dev, repeats=reps)
    profiles = {"fp8_unfused": top_kernels(step8)} if args.profile_prefill and dev == "cuda" else {}
    gen8.model_wrapper.set_kernel_config(base_cfg)
    try:
        t8 = timed(step8, iters=n, device=dev, repeats=reps)
        if profiles:
            profiles["fp8"] = top_kernels(step8)
    except Exception as e:  # noqa: BLE001 (reported; the other rows stand)
        print(f"prefill: the FP8 step with the fused quantization failed: {e!r:.800}", flush=True)
        t8 = float("nan")
    print(f"prefill {T_pre} tokens ms: bf16 {tr * 1e3:.2f}, FP8 {t8 * 1e3:.2f} (fused quantization), "
          f"FP8 unfused {t8_unfused * 1e3:.2f}", flush=True)
    # FP8 weights + an FP8 (e4m3) KV cache: the prefill's attention on fa2 (bf16 q over the e4m3 cache) or on
    # fa3 all-e4m3 (KernelConfig.fp8_kv_prefill, attention/fa3_fp8.py)
    kv8e = gen8.allocate_kv_cache(per + 1, bs, dtype=E4M3)
    step8e = prefill_step(gen8, kv8e, bs, T_pre, torch.arange(per + 1))
    t8kv = {}
    for attn in ("fa2", "fa3"):
        gen8.model_wrapper.set_kernel_config(dataclasses.replace(base_cfg, fp8_kv_prefill=attn))
        try:
            t8kv[attn] = timed(step8e, iters=n, device=dev, repeats=reps) * 1e3
            if args.profile_prefill and dev == "cuda":
                profiles[f"fp8+fp8kv[{attn}]"] = top_kernels(step8e)
        except Exception as e:  # noqa: BLE001 (reported; the other rows stand)
            print(f"prefill: FP8 + FP8 KV ({attn}) failed: {e!r:.800}", flush=True)
            t8kv[attn] = float("nan")
        print(f"prefill {T_pre} tokens ms: FP8 + FP8 KV, attention {attn}: {t8kv[attn]:.2f} "
              f"({tr * 1e3 / t8kv[attn]:.3f}x bf16)", flush=True)
    gen8.model_wrapper.set_kernel_config(base_cfg)
    del kv8e
    t8_variants = {}
    for vname, over in prefill_variants.items():  # then the bf16 and default rows again (the same run's spread)
        gen8.model_wrapper.set_kernel_config(dataclasses.replace(base_cfg, **over))
        t8_variants[vname] = timed(step8, iters=n, device=dev, repeats=reps) * 1e3
        if profiles:
            profiles[f"fp8[{vname}]"] = top_kernels(step8)
        print(f"prefill {T_pre} tokens ms: FP8[{vname}] {t8_variants[vname]:.2f} ({tr * 1e3 / t8_variants[vname]:.3f}x "
              f"bf16)", flush=True)
    gen8.model_wrapper.set_kernel_config(base_cfg)
    if prefill_variants:
        tr2, t82 = timed(stepr, iters=n, device=dev, repeats=reps), timed(step8, iters=n, device=dev, repeats=reps)
        t8_variants.update({"bf16 again": tr2 * 1e3, "default again": t82 * 1e3})
        print(f"prefill {T_pre} tokens ms, again: bf16 {tr2 * 1e3:.2f}, FP8 {t82 * 1e3:.2f}", flush=True)
    if profiles:
        profiles["bf16"] = top_kernels(stepr)
        for name, rows in profiles.items():
            print(f"prefill {T_pre} {name}, top CUDA kernels (ms, calls): "
                  + "; ".join(f"{k} {ms:.2f} x{c}" for k, ms, c in rows), flush=True)
    if dev == "cuda":  # the FP8 + bf16 KV row again after the FP8-KV rows (the run's spread)
        t8kv["fp8_bf16kv_again"] = timed(step8, iters=n, device=dev, repeats=reps) * 1e3
    del kv8, kvr
    chain_bf16, _ = gemm_chain(cfg, T_pre, dev, n)
    chain_fp8 = fp8_gemm_chain(cfg, T_pre, dev, n) if dev == "cuda" else float("nan")
    chain_blk = float("nan")
    if dev == "cuda" and args.kind == "block":
        from model_wrapper.kernels.fp8 import _block_mm_works

        works = _block_mm_works(torch.device(dev, torch.cuda.current_device()), 4096, 4096)
        chain_blk = fp8_gemm_chain(cfg, T_pre, dev, n, blocks=True) if works else chain_blk
    res["prefill"] = dict(tokens=T_pre, fp8_ms=t8 * 1e3, bf16_ms=tr * 1e3, speedup_vs_bf16=tr / t8,
                          fp8_unfused_quant_ms=t8_unfused * 1e3, unfused_speedup_vs_bf16=tr / t8_unfused,
                          top_kernels=profiles, variants_ms=t8_variants, fp8_fp8kv_ms=t8kv,
                          fp8_fp8kv_speedup_vs_bf16={k: tr * 1e3 / v for k, v in t8kv.items()},
                          fp8_gemm_chain_ms=chain_fp8 * 1e3, fp8_block_gemm_chain_ms=chain_blk * 1e3,
                          bf16_gemm_chain_ms=chain_bf16 * 1e3, ratio_to_fp8_chain=t8 / chain_fp8)
    print("prefill", res["prefill"], flush=True)

    if not args.skip_engine:
        g = torch.Generator().manual_seed(1)
        n_p = args.engine_prompts if not args.tiny else 4
        in_len, out_len = (512, 128) if not args.tiny else (32, 8)
        prompts = [torch.randint(0, cfg["vocab_size"], (in_len,), generator=g).tolist() for _ in range(n_p)]
        e8 = run_engine(gen8, E4M3, prompts, out_len, dev)
        er = run_engine(genr, None, prompts, out_len, dev)
        res["engine"] = dict(prompts=n_p, input_len=in_len, output_len=out_len, fp8_fp8kv=e8, bf16=er,
                             speedup=e8["tokens_per_s"] / er["tokens_per_s"])
        print("engine", res["engine"], flush=True)

    save(res, args)


def top_kernels(step, top: int = 12) -> list:
    """One step under torch.profiler: [(kernel name (60 chars), CUDA ms, calls)] by CUDA time."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = getattr(e, "self_cuda_time_total", 0) if us is None else us  # (older torch's name)
        if us > 0:
            rows.append((e.key[:60], us / 1e3, e.count))
    return sorted(rows, key=lambda r: -r[1])[:top]


def save(res, args):
    os.makedirs(args.out, exist_ok=True)
    stem = ("fp8" if not args.tiny else "fp8_tiny") + ("_decode" if args.decode_only else "") + (
        "_prefill" if args.prefill_only else "")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(args.out, stem + ".png"))


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(d["config"] for d in res["decode"]):
        rows = [d for d in res["decode"] if d["config"] == name]
        line, = a.plot([d["batch"] for d in rows], [d["step_ms"] for d in rows], "o-", label=name)
        a.plot([d["batch"] for d in rows], [d["floor_ms"] for d in rows], "--", color=line.get_color(), alpha=0.6)
    a.set(xlabel="batch", ylabel="ms / decode step", xscale="log", title=f"decode, ctx {res['context']} (dashed: floor)")
    if res["decode"]:
        a.legend()
    else:
        a.set_visible(False)
    if "prefill" not in res:
        b.set_visible(False)
        fig.suptitle(f"{res['model']} on {res['device']}")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return
    p = res["prefill"]
    names = ["fp8", "fp8 unfused quant", "bf16", "fp8 GEMM chain", "fp8 block GEMM chain", "bf16 GEMM chain"]
    vals = [p["fp8_ms"], p.get("fp8_unfused_quant_ms", float("nan")), p["bf16_ms"], p["fp8_gemm_chain_ms"],
            p.get("fp8_block_gemm_chain_ms", float("nan")), p["bf16_gemm_chain_ms"]]
    b.bar(names, vals)
    b.set(ylabel="ms", title=f"prefill {p['tokens']} tokens")
    fig.suptitle(f"{res['model']} on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
