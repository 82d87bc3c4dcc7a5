"""Mixture-of-experts speed on the Qwen3-30B-A3B shape (random weights): decode and prefill against
the bytes / GEMMs they must cost, the previous MoE path beside the current one, bf16 and FP8 experts, and
transformers' own generate, all in the same run.

    python3 benchmarks/bench_moe.py --out benchmarks/results        # -> moe.json, moe.png

variants old       the first MoE path (KernelConfig with no decode path, the torch-ops sort and routing)
         prev      session 31's defaults (torch's routing ops, the K-looped decode kernels of moe_decode.py)
         s32       session 32's defaults (new without session 33's q / k norm fusion, fused router, attention PDL)
         new       KernelConfig() as it stands (one routing kernel; kernels/moe_gemv.py at few pairs, the fused
                   align and grouped GEMMs above)
         new-p64   new with the register-tile decode path up to 64 token-expert pairs (8 tokens)
         qk-sep    new with Qwen3's q / k norms as kernels of their own (KernelConfig.rope_store_qk_norm off)
         router-sep new with the router's GEMV and the routing kernel apart (KernelConfig.moe_fused_router off)
         t32k, t8k new with the MoE GEMVs' tiles (moe_gemv_tile, moe_gemv_down_tile) at 32k / 8k weights
         w4, w16   new with the MoE GEMVs at 4 / 16 warps (moe_gemv_warps)
         nopdl     new with no programmatic dependent launch (KernelConfig.pdl off): what PDL hides
         attn-pdl, attn-nopdl  new with the graphs' decode attention launched with PDL at every batch / at none
                   (KernelConfig.decode_attention_pdl_max_batch; default: batches of 1-2)
         lf-off    new with the bf16 gate_up GEMV's loads in ptxas's order (KernelConfig.moe_gemv_loads_first off)
         route-rank new with the routing's top-k by the [E, E] rank (KernelConfig.moe_route_sort off)
         norouter-norm, norouter-norm-fp8  new / new-fp8 with the post-attention add + RMSNorm as a kernel of its own
                   before the router (KernelConfig.gemv_add_norm_router off; default on: inside the router + routing
                   kernel)
         new-fp8   the same with every layer's experts in e4m3 + float32 scales per row and 128 columns
                   (quantized here from the random bf16 ones; the rest of the model stays bf16); s33-fp8 with
                   session 33's FP8 GEMVs (moe_fp8_packed_round off, tiles of 32k e4m3 weights), t16k-fp8 with
                   dequantized tiles of 16k (KernelConfig.moe_fp8_gemv_tile, moe_fp8_gemv_down_tile: 8k); w8a8-fp8 with
                   the grouped GEMMs of batch 8 up and prefill multiplying e4m3 activations (KernelConfig.moe_fp8_w8a8,
                   the default since session 41), wonly-fp8 with them weight-only (dequantized tiles); dequant-fp8
                   with session 43's decode GEMVs (tiles dequantized to bf16, KernelConfig.moe_fp8_direct off, 8
                   pairs), direct32-fp8 with 32k e4m3 tiles (default 16k), p16-fp8 / p64-fp8 / p128-fp8 with the decode
                   path up to 16 / 64 / 128 pairs (default 32); ckpt-g1-fp8: ckpt-fp8 with the FP8 GEMV at 1 token only (fp8_gemv_max_tokens), ckpt-g2-fp8
                   with every 2-token FP8 projection on it (fp8_gemv_multi_token_max_weights unbounded)
         ckpt-fp8  new-fp8 with the attention projections (q / k / v / o) in block FP8 too, as the shipped
                   Qwen3-30B-A3B-FP8 checkpoint holds them (router, norms, embeddings and lm_head stay bf16);
                   quantized in place, so it runs after every other variant; its floor counts those bytes
         --variants-json '{"name": {KernelConfig field: value}}': more variants without editing this file (a name
                   ending in -fp8 runs on the FP8 experts)
decode   B = 1 / 8 / 32 / 128 at 512 and 2048 tokens of context, graph replay. Floor: the bytes a step
         must read over copy bandwidth: the attention and router weights, the final norm and lm_head,
         the KV of every request, and per layer the experts its tokens route to (2 bytes a weight, or 1
         and the scales for FP8). With random weights the router spreads tokens evenly, so B tokens reach
         E * (1 - (1 - k / E)^B) distinct experts of a layer in expectation (the floor uses that count).
         Every variant's decode rows read the same random K / V (fill_kv, since session 41; before, the cache held
         zeros or what an earlier variant's prefill wrote, and the routing followed it).
prefill  T = 1024 / 4096 tokens against a grouped-GEMM chain of the same shapes (bf16): per layer qkv, o
         and the experts as batched matmuls of T * k / E rows each (balanced routing), and lm_head.
peer     transformers' Qwen3MoeForCausalLM, static-cache generate at batch 32 (prompt 512): ms / step.
profile  (--profile VARIANTS) per variant named, one decode step at batch 1 and 32 (context 512) under
         torch.profiler, graph replay: its kernels put in parts of the model (benchmarks/moe_breakdown.py)
         beside each part's bytes floor -> moe_profile.json and a table in the log. --profile-prefill VARIANTS:
         their prefill's GPU time by kernel name (one profiled call of --profile-prefill-tokens, default 4096)
         -> the same file and the log.
--device cpu --tiny: a smoke run of the script on a shrunk model (no profile, no peer).

Memory: the model is built in bf16 on the GPU (about 61 GB for 48 layers) and the KV cache is sized to the
largest decode case unless --kv-gib is given, so the decode cases fit an 80 GB card; the FP8 variants
quantize the experts in place, one layer at a time (the model shrinks to about 32 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_forward import (copy_bandwidth, decode_case, decode_step, hf_decode_step, prefill_case,  # noqa: E402
                                      prefill_step, timed)
from benchmarks.common import linear_to_fp8, pyplot, random_text_generator  # noqa: E402
from benchmarks.moe_breakdown import EXPERT_KERNELS, is_any, profile_steps, summary, table  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402

# session 33's switches off: session 32's defaults
S32 = dataclasses.replace(KernelConfig(), rope_store_qk_norm=False, moe_fused_router=False,
                          decode_attention_pdl_max_batch=0, gemv_add_norm=False)
# the MoE path before the decode path and the fused align: torch's routing ops and sort, grouped GEMMs at every size
OLD_MOE = dataclasses.replace(S32, moe_decode_pairs=0, moe_fused_align=False, moe_fused_route=False)
# session 31's defaults: the sort-free decode path's K-looped kernels (moe_decode.py) after torch's routing ops
PREV_MOE = dataclasses.replace(S32, moe_fused_route=False, moe_decode_gemv=False)
# the bf16 variants first: the fp8 ones quantize the model in place
VARIANTS = {"old": OLD_MOE, "prev": PREV_MOE, "s32": S32, "new": KernelConfig(),
            "new-p64": dataclasses.replace(KernelConfig(), moe_decode_pairs=64),
            # A/B rows of single KernelConfig fields (bf16)
            "qk-sep": dataclasses.replace(KernelConfig(), rope_store_qk_norm=False),
            "router-sep": dataclasses.replace(KernelConfig(), moe_fused_router=False),
            "t32k": dataclasses.replace(KernelConfig(), moe_gemv_tile=32768, moe_gemv_down_tile=32768),
            "t8k": dataclasses.replace(KernelConfig(), moe_gemv_tile=8192, moe_gemv_down_tile=8192),
            "w4": dataclasses.replace(KernelConfig(), moe_gemv_warps=4),
            "w16": dataclasses.replace(KernelConfig(), moe_gemv_warps=16),
            "nopdl": dataclasses.replace(KernelConfig(), pdl=False),
            "attn-pdl": dataclasses.replace(KernelConfig(), decode_attention_pdl_max_batch=1 << 20),
            "attn-nopdl": dataclasses.replace(KernelConfig(), decode_attention_pdl_max_batch=0),
            # the residual add + RMSNorm inside the qkv GEMV at 1 token (session 34; off by default)
            "addnorm-qkv": dataclasses.replace(KernelConfig(), gemv_add_norm=True, gemv_add_norm_qkv=True),
            "noaddnorm": dataclasses.replace(KernelConfig(), gemv_add_norm=False),
            # the dense GEMVs (qkv, o) at 1 token as 2 row blocks a program in turn (session 35)
            "gemv-r2": dataclasses.replace(KernelConfig(), gemv_rounds=2),
            # session 34's switches: the gate_up GEMV's loads in ptxas's order (session 33's kernel); the routing's
            # [E, E] rank instead of the bitonic top-k
            "lf-off": dataclasses.replace(KernelConfig(), moe_gemv_loads_first=False),
            "route-rank": dataclasses.replace(KernelConfig(), moe_route_sort=False),
            # session 35: the post-attention add + RMSNorm as its own kernel before the router (default: inside it)
            "norouter-norm": dataclasses.replace(KernelConfig(), gemv_add_norm_router=False),
            # session 46: the fused RoPE + store (+ q / k norms) past 1024 tokens too (a prefill's steps; beyond
            # rope_store_max_tokens the unfused chain ran): a program a token and head (rope-t1), or a head and 16 / 32
            # tokens as one tile (rope_store_block_t)
            "rope-t1": dataclasses.replace(KernelConfig(), rope_store_max_tokens=1 << 30,
                                           rope_store_block_t_min_tokens=1 << 30),
            "rope-s45": dataclasses.replace(KernelConfig(), rope_store_max_tokens=1024,
                                            rope_store_block_t_min_tokens=1 << 30),  # the defaults before (A/B)
            "rope-t16": dataclasses.replace(KernelConfig(), rope_store_max_tokens=1 << 30, rope_store_block_t=16),
            "rope-t32": dataclasses.replace(KernelConfig(), rope_store_max_tokens=1 << 30, rope_store_block_t=32),
            # session 46: the grouped GEMMs' prefill weight tiles through pointer loads (the default since: TMA
            # descriptors; its c7 ran "tma" / "tma-fp8" against "new" / "new-fp8" before the default changed)
            "notma": dataclasses.replace(KernelConfig(), moe_tma_weights=False),
            # ... and the small tiles' (decode batches 8-256) through TMA (moe_tma_small_weights; off by default)
            "tma-small": dataclasses.replace(KernelConfig(), moe_tma_small_weights=True),
            "new-fp8": KernelConfig(), "new-fp8-p64": dataclasses.replace(KernelConfig(), moe_decode_pairs=64),
            # the attention half (session 35): the decode kernel's page metadata and first K / V tile prefetch before its
            # PDL wait off (KernelConfig.decode_attention_prefetch, the A/B baseline)
            "attn-nopf": dataclasses.replace(KernelConfig(), decode_attention_prefetch=False),
            "new2": KernelConfig(),  # new again, later in the run: what the run's order alone changes
            "attn-nopf-fp8": dataclasses.replace(KernelConfig(), decode_attention_prefetch=False),
            # session 33's FP8 GEMVs: one-value rounding, tiles of the bf16 tiles' bytes
            "s33-fp8": dataclasses.replace(KernelConfig(), moe_fp8_direct=False, moe_fp8_packed_round=False,
                                           moe_fp8_gemv_tile=32768,
                                           moe_fp8_gemv_down_tile=32768),
            "t16k-fp8": dataclasses.replace(KernelConfig(), moe_fp8_direct=False, moe_fp8_gemv_tile=16384,
                                            moe_fp8_gemv_down_tile=16384),
            "norouter-norm-fp8": dataclasses.replace(KernelConfig(), gemv_add_norm_router=False),
            "gemv-r2-fp8": dataclasses.replace(KernelConfig(), gemv_rounds=2),
            # session 40: FP8 experts' grouped GEMMs (batch 8 up, prefill) as W8A8 e4m3 products (the default
            # since session 41, with its own prefill tiles); wonly-fp8: weight-only, as before
            "w8a8-fp8": dataclasses.replace(KernelConfig(), moe_fp8_w8a8=True),
            "wonly-fp8": dataclasses.replace(KernelConfig(), moe_fp8_w8a8=False),
            # session 42: the attention projections in block FP8 as well (the FP8 checkpoint's layout)
            "ckpt-fp8": KernelConfig(),
            # session 44: FP8 experts kept e4m3 in the decode GEMVs' registers, each group's sum scaled (moe_fp8_direct,
            # now the default, with 16k tiles and the decode path up to 16 pairs); dequant-fp8: the session-43 default
            # (tiles dequantized to bf16, 8k, 8 pairs); direct32-fp8: 32k tiles; p32-fp8: the decode path up to 32
            # pairs; new2-fp8: the default again later in the run
            "dequant-fp8": dataclasses.replace(KernelConfig(), moe_fp8_direct=False, moe_fp8_decode_pairs=8),
            "direct32-fp8": dataclasses.replace(KernelConfig(), moe_fp8_direct_tile=32768,
                                                moe_fp8_direct_down_tile=32768),
            "p16-fp8": dataclasses.replace(KernelConfig(), moe_fp8_decode_pairs=16),
            "p64-fp8": dataclasses.replace(KernelConfig(), moe_fp8_decode_pairs=64),
            "p128-fp8": dataclasses.replace(KernelConfig(), moe_fp8_decode_pairs=128),
            # the block-FP8 attention projections' 2-token steps on skinny_mma instead of the FP8 GEMV
            "ckpt-g1-fp8": dataclasses.replace(KernelConfig(), fp8_gemv_max_tokens=1),
            # every 2-token FP8 projection on the GEMV (fp8_gemv_multi_token_max_weights unbounded: before session 44)
            "ckpt-g2-fp8": dataclasses.replace(KernelConfig(), fp8_gemv_multi_token_max_weights=1 << 40),
            # session 45: the block-FP8 attention projections' skinny_mma launch of session 44 (rows halved to 128
            # programs, K not split)
            "ckpt-s44-fp8": dataclasses.replace(KernelConfig(), fp8_skinny_mma_min_programs=128,
                                                fp8_skinny_mma_split_programs=0),
            # ... and with rows halved to 32 where K splits (fp8_skinny_mma_split_min_rows): o's 2048 rows
            "ckpt-r32-fp8": dataclasses.replace(KernelConfig(), fp8_skinny_mma_split_min_rows=32),
            # session 47: the block-FP8 attention projections' 2-16 token skinny_mma with pointer loads of its weight
            # tiles (the default since: TMA descriptors, fp8_skinny_mma_tma)
            "ckpt-ptr-fp8": dataclasses.replace(KernelConfig(), fp8_skinny_mma_tma=False),
            # ... and their 17-32 token steps on cuBLASLt's block-scaled GEMM (fp8_skinny_mma_max_tokens 16: before
            # session 47, which measured the new bound of 32 on Llama-3-8B's shapes only)
            "ckpt-m16-fp8": dataclasses.replace(KernelConfig(), fp8_skinny_mma_max_tokens=16),
            "notma-fp8": dataclasses.replace(KernelConfig(), moe_tma_weights=False),
            "tma-small-fp8": dataclasses.replace(KernelConfig(), moe_tma_small_weights=True, moe_w8a8_swap=False),
            # session 47: the W8A8 small tiles as W a^T with TMA weight tiles (moe_w8a8_swap; wgmma e4m3 products),
            # the default since (session 47's c7 / c8 ran "swap-tma-fp8" against "new-fp8" before the switch, and a
            # "swap-fp8" row, swapped with pointer loads, that the final rule no longer makes); noswap-fp8: before
            "swap-tma-fp8": dataclasses.replace(KernelConfig(), moe_w8a8_swap=True, moe_tma_small_weights=True),
            "noswap-fp8": dataclasses.replace(KernelConfig(), moe_w8a8_swap=False),
            # session 48: the small tiles' launch re-swept under the swap (W8A8 with TMA weight tiles): pipeline
            # stages (moe_stages, 3) and weight rows a program (moe_block_n, 64)
            "s4-fp8": dataclasses.replace(KernelConfig(), moe_stages=4),
            "s5-fp8": dataclasses.replace(KernelConfig(), moe_stages=5),
            "n128-fp8": dataclasses.replace(KernelConfig(), moe_block_n=128),
            "n128s4-fp8": dataclasses.replace(KernelConfig(), moe_block_n=128, moe_stages=4),
            # ... and the W8A8 GEMMs' x quantized by the add + RMSNorm before them (moe_w8a8_norm_quant: a kernel a
            # layer fewer); nq2-fp8 the same later in the run; ckpt-nq-fp8 with block-FP8 attention
            # (c5 ran these with the switch at every W8A8 step; the default since: on from 256 pairs, nqoff-fp8 off)
            "nq-fp8": dataclasses.replace(KernelConfig(), moe_w8a8_norm_quant=True, moe_w8a8_norm_quant_min_pairs=0),
            "nq2-fp8": dataclasses.replace(KernelConfig(), moe_w8a8_norm_quant=True, moe_w8a8_norm_quant_min_pairs=0),
            "ckpt-nq-fp8": dataclasses.replace(KernelConfig(), moe_w8a8_norm_quant=True,
                                               moe_w8a8_norm_quant_min_pairs=0),
            "nqoff-fp8": dataclasses.replace(KernelConfig(), moe_w8a8_norm_quant=False),
            "new2-fp8": KernelConfig()}
CKPT_FP8 = {"ckpt-fp8", "ckpt-g1-fp8", "ckpt-g2-fp8", "ckpt-s44-fp8", "ckpt-r32-fp8", "ckpt-ptr-fp8", "ckpt-m16-fp8",
            "ckpt-nq-fp8"}  # the variants that also quantize the attention projections (in place: run last), and every
# --variants-json name that starts with "ckpt-" and ends with "-fp8"


def ckpt_fp8(variant: str) -> bool:
    return variant in CKPT_FP8 or (variant.startswith("ckpt-") and variant.endswith("-fp8"))

QWEN3_30B_A3B = dict(
    architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=151936, hidden_size=2048,
    intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
    num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960, rms_norm_eps=1e-6,
    rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu", initializer_range=0.02,
)


def tiny_moe(cfg: dict) -> dict:
    """The same architecture shrunk for a CPU smoke run."""
    return dict(cfg, vocab_size=512, hidden_size=256, moe_intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                max_position_embeddings=4096)


def shapes(cfg: dict) -> dict:
    H, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    E, k, inter = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    return dict(H=H, q=q, kv=kv, E=E, k=k, I=inter, L=cfg["num_hidden_layers"], V=cfg["vocab_size"])


def attn_proj_bytes(s: dict, elem: int = 2, fp8: bool = False) -> int:
    """A layer's q / k / v / o weights: elem bytes a weight, or (block FP8, Fp8Method's layout) one byte a weight
    and a float32 scale per row and 128 columns."""
    n_qkv, weights = s["q"] + 2 * s["kv"], s["H"] * (s["q"] + 2 * s["kv"]) + s["q"] * s["H"]
    if not fp8:
        return weights * elem
    return weights + 4 * (n_qkv * -(-s["H"] // 128) + s["H"] * -(-s["q"] // 128))


def decode_floor_bytes(cfg: dict, B: int, ctx: int, elem: int = 2, fp8_experts: bool = False,
                       fp8_attn: bool = False) -> float:
    s = shapes(cfg)
    if fp8_experts:  # a byte a weight and a float32 scale per row and 128 columns
        expert = 3 * s["H"] * s["I"] + 4 * (2 * s["I"] * -(-s["H"] // 128) + s["H"] * -(-s["I"] // 128))
    else:
        expert = 3 * s["H"] * s["I"] * elem
    touched = s["E"] * (1 - (1 - s["k"] / s["E"]) ** B)
    kv = 2 * s["kv"] * ctx * B
    per_layer = attn_proj_bytes(s, elem, fp8_attn) + (s["E"] * s["H"] + 2 * s["H"] + kv) * elem + touched * expert
    return s["L"] * per_layer + (s["V"] * s["H"] + s["H"]) * elem


def logit_checks(step_logits: dict, variants: list[str]) -> list[dict]:
    """Each variant's logits of the same step {(variant, B): [B, V]} against new's (FP8 variants: the first FP8
    one's, and bf16's new): bit-equal where only launches change (PDL), apart where a kernel rounds differently and
    a near-tie of two experts' router scores routes a token apart (random weights)."""
    out = []
    for (variant, B), logits in step_logits.items():
        fp8 = variant.endswith("fp8")
        same_kind = [v for v in variants if v.endswith("fp8") == fp8]
        ref = "new" if not fp8 and "new" in same_kind else same_kind[0]
        # and against new2 (new run again later) where it ran: whether a difference is the variant's or the order's;
        # an FP8 variant also against bf16's new (the scale of FP8's own rounding through this many random layers,
        # beside which an FP8 variant's difference from the first FP8 one reads)
        extra = ["new2"] if not fp8 and "new2" in variants and variant not in ("new2", ref) else []
        extra += ["new"] if fp8 and "new" in variants else []
        for against in [ref] + extra:
            if variant == against:
                continue
            want = step_logits[against, B]
            diff = (logits - want).abs().max().item() / want.abs().max().item()
            same = torch.equal(logits.argmax(-1), want.argmax(-1))
            out.append(dict(variant=variant, against=against, batch=B, max_rel_diff=diff, argmax_equal=same))
            print(f"{variant:8s} logits B={B}: max |diff| / max |ref| {diff:.2e} against {against}"
                  f"{'' if same else ', argmax differs'}", flush=True)
    return out


def part_floors_us(cfg: dict, B: int, ctx: int, bw: float, fp8_experts: bool = False, fp8_attn: bool = False) -> dict:
    """Microseconds each part of a decode step must take to read its bytes at bw (bytes / s): the
    moe_breakdown parts that read weights or KV (decode_floor_bytes, split)."""
    s = shapes(cfg)
    L, elem = s["L"], 2
    if fp8_experts:
        expert = 3 * s["H"] * s["I"] + 4 * (2 * s["I"] * -(-s["H"] // 128) + s["H"] * -(-s["I"] // 128))
    else:
        expert = 3 * s["H"] * s["I"] * elem
    touched = s["E"] * (1 - (1 - s["k"] / s["E"]) ** B)
    parts = {"experts": L * touched * expert, "attn proj": L * attn_proj_bytes(s, elem, fp8_attn),
             "router GEMV": L * s["E"] * s["H"] * elem, "attention": L * 2 * s["kv"] * ctx * B * elem,
             "lm_head": s["V"] * s["H"] * elem}
    return {k: v / bw * 1e6 for k, v in parts.items()}


def fill_kv(kv, seed: int = 0) -> None:
    """Every cache block to the same random K / V (standard normal, the scale of a projection of normalized rows),
    before each variant's decode rows: the routing, and so the experts a step reads, follows what attention reads.
    (Session 41: over the allocator's zeros, or over what an earlier variant's prefill left, the same FP8 batch-8
    step took 6.3 or 4.4 ms on an H200.)"""
    g = torch.Generator(device=kv[0][0].device).manual_seed(seed)
    for k, v in kv:
        k.normal_(generator=g)
        v.normal_(generator=g)


def quantize_fp8_blockwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, rows, cols] -> (e4m3 [E, rows, cols], float32 scales [E, rows, ceil(cols / 128)]): absmax per
    row and 128-column group over e4m3's largest value, the block-wise FP8 checkpoints' layout."""
    E, R, C = w.shape
    G = -(-C // 128)
    padded = torch.nn.functional.pad(w.float(), (0, G * 128 - C)).view(E, R, G, 128)
    scale = padded.abs().amax(-1).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    q = (padded / scale[..., None]).view(E, R, G * 128)[..., :C].to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def quantize_experts(model) -> None:
    """Every sparse layer's experts of model to e4m3 + scales in place (one layer at a time: the bf16
    copy of a layer is freed before the next is quantized)."""
    from model_wrapper.layers.moe import SparseMoE

    for m in model.modules():
        if isinstance(m, SparseMoE):
            ex = m.experts
            for name, scale_name in (("gate_up_proj", "gate_up_proj_scale"), ("down_proj", "down_proj_scale")):
                q, scale = quantize_fp8_blockwise(getattr(ex, name).data)
                setattr(ex, name, torch.nn.Parameter(q, requires_grad=False))
                setattr(ex, scale_name, scale)


def quantize_attention(model) -> None:
    """Every attention projection (q / k / v / o, fused as the model holds them) to block FP8 in place: e4m3 and a
    float32 scale per 128 x 128 block, held per row as Fp8Method holds a fine-grained FP8 checkpoint's scales."""
    for name, lin in model.named_modules():
        w = getattr(lin, "weight", None)
        if ".self_attn." in name + "." and isinstance(w, torch.nn.Parameter) and w.dim() == 2 and w.is_floating_point() \
                and w.dtype != torch.float8_e4m3fn:
            linear_to_fp8(lin, "block")


def grouped_chain(cfg: dict, T: int, iters: int, dev: str = "cuda") -> float:
    """Seconds of the prefill's GEMMs alone: per layer qkv, o, the experts (balanced) and lm_head."""
    s = shapes(cfg)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    x = torch.randn(T, s["H"], device=dev, dtype=dt)
    wqkv = torch.randn(s["q"] + 2 * s["kv"], s["H"], device=dev, dtype=dt)
    xo = torch.randn(T, s["q"], device=dev, dtype=dt)
    wo = torch.randn(s["H"], s["q"], device=dev, dtype=dt)
    rows = max(1, T * s["k"] // s["E"])
    xe = torch.randn(s["E"], rows, s["H"], device=dev, dtype=dt)
    wgu = torch.randn(s["E"], s["H"], 2 * s["I"], device=dev, dtype=dt)
    ae = torch.randn(s["E"], rows, s["I"], device=dev, dtype=dt)
    wd = torch.randn(s["E"], s["I"], s["H"], device=dev, dtype=dt)
    lm = torch.randn(s["V"], s["H"], device=dev, dtype=dt)

    def chain():
        for _ in range(s["L"]):
            torch.nn.functional.linear(x, wqkv)
            torch.nn.functional.linear(xo, wo)
            torch.bmm(xe, wgu)
            torch.bmm(ae, wd)
        torch.nn.functional.linear(x[-1:], lm)

    return timed(chain, iters=iters, device=dev)


def random_hf_moe(cfg: dict):
    import transformers

    conf = transformers.Qwen3MoeConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a shrunk model (a CPU smoke run)")
    ap.add_argument("--kv-gib", type=float, default=None,
                    help="KV cache size (default: what the largest decode case needs, +10%%)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (a quick run); floors scale with it")
    ap.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill cases")
    ap.add_argument("--batches", default="1,8,32,128", help="decode batch sizes, comma-separated")
    ap.add_argument("--contexts", default="512,2048", help="decode contexts, comma-separated")
    ap.add_argument("--variants", default="old,new,new-fp8", help="of " + ", ".join(VARIANTS))
    ap.add_argument("--variants-json", default="",
                    help='more variants, JSON {"name": {KernelConfig field: value}} (a name ending in -fp8 runs on the '
                         'FP8 experts, after the bf16 ones; a name "ckpt-...-fp8" quantizes the attention projections to block FP8 too, as '
                         'the ckpt-fp8 variant); they run with --variants\' list')
    ap.add_argument("--profile", default="", help="variants (comma-separated) whose decode step at batch 1 and 32 "
                    "gets a kernel breakdown")
    ap.add_argument("--profile-prefill", default="", help="variants (comma-separated) whose prefill gets a kernel "
                    "breakdown: GPU time by kernel name, the largest first")
    ap.add_argument("--profile-prefill-tokens", default="4096", help="with --profile-prefill: the prompt lengths")
    args = ap.parse_args()
    if args.variants_json:
        for name, over in json.loads(args.variants_json).items():
            VARIANTS[name] = dataclasses.replace(KernelConfig(), **over)
            args.variants += "," + name
    batches, contexts = [int(b) for b in args.batches.split(",")], [int(c) for c in args.contexts.split(",")]
    # in VARIANTS' order, every bf16 variant before the first FP8 one (which quantizes the model in place: a bf16
    # variant listed after it, e.g. new2 or attn-nopf, would otherwise run on the FP8 experts)
    variants = sorted((v for v in VARIANTS if v in args.variants.split(",")),
                      key=lambda v: (v.endswith("fp8"), ckpt_fp8(v)))
    dev = args.device
    cuda = dev == "cuda"
    cfg = tiny_moe(QWEN3_30B_A3B) if args.tiny else dict(QWEN3_30B_A3B)
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    bw = copy_bandwidth(dev)
    res = dict(device=torch.cuda.get_device_name(0) if cuda else dev, torch=torch.__version__,
               model="Qwen3-30B-A3B-shaped, random weights" if not args.tiny else "tiny",
               layers=cfg["num_hidden_layers"], copy_bandwidth_TBps=bw / 1e12, block_size=16)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    gen = random_text_generator(cfg, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
    mem = (lambda: torch.cuda.memory_allocated() / 2**30) if cuda else (lambda: 0.0)
    print(f"model built: {mem():.1f} GiB allocated", flush=True)
    kv_tok = gen.kv_cache_spec.bytes_per_token
    if args.kv_gib is not None:
        num_blocks = int(args.kv_gib * 2**30 // (kv_tok * 16))
    else:  # the largest decode case (and a 4k prefill) with a tenth to spare
        tokens = max(max(batches) * max(contexts), 0 if args.decode_only else 4096)
        num_blocks = int(1.1 * -(-tokens // 16)) + 16
    kv = gen.allocate_kv_cache(num_blocks, 16)
    print(f"KV cache: {num_blocks} blocks of 16 ({num_blocks * 16 * kv_tok / 2**30:.2f} GiB)", flush=True)
    perm = torch.randperm(num_blocks)
    decode, prefill, profiles, step_logits = [], [], [], {}
    quantized = attn_quantized = False
    for variant in variants:
        kc = VARIANTS[variant]
        fp8, fp8_attn = variant.endswith("fp8"), ckpt_fp8(variant)
        if fp8 and not quantized:
            quantize_experts(gen.model_wrapper.model)
            quantized = True
        if fp8_attn and not attn_quantized:
            quantize_attention(gen.model_wrapper.model)
            attn_quantized = True
        gen.model_wrapper.set_kernel_config(kc)  # drops the graphs the variant before captured
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        fill_kv(kv)
        for B in batches:
            for ctx in contexts:
                if B * -(-ctx // 16) > num_blocks:
                    continue
                t = decode_case(gen, kv, 16, B, ctx, perm, 30 if cuda else 2)
                floor = decode_floor_bytes(cfg, B, ctx, fp8_experts=fp8, fp8_attn=fp8_attn) / bw
                decode.append(dict(variant=variant, batch=B, context=ctx, step_ms=t * 1e3, floor_ms=floor * 1e3,
                                   ratio=t / floor))
                print(f"{variant:8s} decode B={B:4d} ctx={ctx:5d}: {t * 1e3:7.2f} ms  floor {floor * 1e3:6.2f} ms"
                      f"  x{t / floor:.2f}", flush=True)
        # the same step's logits beside new's (or the first variant's) of the same expert dtype: bit-equal where
        # only the launch changes (PDL), apart where a kernel rounds differently and a near-tie routes apart
        for B in sorted({1, max(batches)}):
            torch.manual_seed(B)
            step_logits[variant, B] = decode_step(gen, kv, 16, B, contexts[0], perm)().float().cpu()
        for B in (1, 32) if cuda and variant in args.profile.split(",") else ():
            ctx = 512
            if B * -(-ctx // 16) > num_blocks:
                continue
            mode = "graph replay"
            try:  # a profiler failure costs the breakdown, not the timings
                steps = profile_steps(decode_step(gen, kv, 16, B, ctx, perm), steps=5)
                if not any(is_any(r["name"], EXPERT_KERNELS) for r in steps[0]):  # no per-kernel records of the graph
                    mw, mode = gen.model_wrapper, "eager (the replay gave no kernel records)"
                    graphs, mw.graphs = mw.graphs, None
                    try:
                        steps = profile_steps(decode_step(gen, kv, 16, B, ctx, perm), steps=5)
                    finally:
                        mw.graphs = graphs
            except Exception as e:  # noqa: BLE001
                print(f"--- {variant} B={B}: profile failed: {e!r}", flush=True)
                continue
            s = summary(steps, part_floors_us(cfg, B, ctx, bw, fp8_experts=fp8, fp8_attn=fp8_attn))
            profiles.append(dict(variant=variant, batch=B, context=ctx, mode=mode, **s))
            print(f"--- {variant} B={B} ctx={ctx}: one decode step's kernels ({mode}, median of 5)\n"
                  f"{table(s)}", flush=True)
        if cuda:
            print(f"{variant}: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB peak allocated", flush=True)
        for T in () if args.decode_only else (1024, 4096):
            n = max(2, 16384 // T)
            t = prefill_case(gen, kv, 16, T, perm, n)
            tg = grouped_chain(cfg, T, n, dev)
            prefill.append(dict(variant=variant, tokens=T, ms=t * 1e3, chain_ms=tg * 1e3, ratio=t / tg))
            print(f"{variant:8s} prefill T={T:5d}: {t * 1e3:7.2f} ms  grouped-GEMM chain {tg * 1e3:7.2f} ms  "
                  f"x{t / tg:.2f}", flush=True)
        for T in (int(t) for t in args.profile_prefill_tokens.split(",")) if cuda and variant in \
                args.profile_prefill.split(",") else ():
            by = prefill_kernels(profile_steps(prefill_step(gen, kv, 16, T, perm), steps=2, warmup=1)[-1])
            profiles.append(dict(variant=variant, prefill_tokens=T, kernels=by))
            total = sum(r["us"] for r in by)
            print(f"--- {variant} prefill T={T}: GPU time by kernel ({total / 1e3:.2f} ms in all, profiled)", flush=True)
            for r in by[:16]:
                print(f"  {r['us'] / 1e3:8.3f} ms  {r['count']:4d} x  {r['name'][:110]}", flush=True)
    res.update(decode=decode, prefill=prefill, logit_checks=logit_checks(step_logits, variants))
    if profiles:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "moe_profile.json"), "w") as f:
            json.dump(dict(device=res["device"], copy_bandwidth_TBps=bw / 1e12, layers=cfg["num_hidden_layers"],
                           profiles=profiles), f, indent=1)
    del kv, gen
    if cuda:
        torch.cuda.empty_cache()
    if cuda and not args.no_peer and any(d["variant"] == "new" and d["batch"] == 32 and d["context"] == 512 for d in decode):
        hf = random_hf_moe(cfg)
        step = hf_decode_step(hf, 32, 512, 16, "cuda")
        ours = next(d for d in decode if d["variant"] == "new" and d["batch"] == 32 and d["context"] == 512)
        res["transformers"] = dict(batch=32, prompt=512, static_cache_step_ms=step * 1e3, our_step_ms=ours["step_ms"],
                                   speedup=step * 1e3 / ours["step_ms"])
        print(f"transformers static-cache generate B=32 prompt=512: {step * 1e3:.2f} ms/step; ours "
              f"{ours['step_ms']:.2f} -> x{step * 1e3 / ours['step_ms']:.2f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(args.out, "moe.png"))


def prefill_kernels(rows: list[dict]) -> list[dict]:
    """One profiled step's kernel records -> [{name, us, count}] summed by kernel name, the largest first."""
    by: dict[str, dict] = {}
    for r in rows:
        d = by.setdefault(r["name"], dict(name=r["name"], us=0.0, count=0))
        d["us"] += r["dur"]
        d["count"] += 1
    return sorted(by.values(), key=lambda d: -d["us"])


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant in ("old", "prev", "new", "new-fp8"):
        rows = [d for d in res["decode"] if d["variant"] == variant and d["context"] == 512]
        line, = a.plot([d["batch"] for d in rows], [d["step_ms"] for d in rows], "o-", label=variant)
        if variant in ("new", "new-fp8"):  # old, prev and new share the bf16 floor
            a.plot([d["batch"] for d in rows], [d["floor_ms"] for d in rows], "--", color=line.get_color(), alpha=0.6)
    a.set(xlabel="batch", ylabel="ms / decode step", title="decode, context 512 (dashed: bytes floor)", xscale="log")
    a.legend()
    p = res["prefill"]
    b.bar([f"{d['variant']}\n{d['tokens']}" for d in p], [d["ratio"] for d in p])
    b.axhline(1.0, color="k", lw=0.8)
    b.set(xlabel="variant / prompt tokens", ylabel="prefill / bf16 grouped-GEMM chain", title="prefill")
    fig.suptitle(f"{res['model']} ({res['layers']} layers) on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
