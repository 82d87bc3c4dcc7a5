"""FP8 (e4m3) linears on the GPU: y = x @ W^T (+ b) with W = float(weight) * weight_scale per output
row and per group of `group` K-columns (kernels/fp8_reference.py states the arithmetic).

    fp8_linear(x, weight, weight_scale, group, bias=None, input_scale=None, cfg) -> y [M, N]
    fp8_gate_up_silu(x, weight, weight_scale, group, ...)                      -> silu(gate) * up [M, N // 2]
    quantize_fp8_per_token_group(x, group)                                     -> (x_fp8 [M, K], scale [M, KG])
                                                                               (kernels/fp8_act.py)

x [M, K] bf16 / fp16 (rows may be strided), weight e4m3 [N, K] row-major, weight_scale float32
[N, KG] (KG = ceil(K / group); per channel / tensor: KG = 1, group = K), bias [N] or None,
input_scale None (activations quantized per token) or a float32 scalar tensor (static).
fp8_path picks the kernel by the step's token count M (thresholds in KernelConfig):

  M <= fp8_gemv_max_tokens     "gemv"       weight-only (kernels/fp8_gemv.py): a program holds whole
                                            e4m3 rows in registers, fp32 sums per 16-column chunk,
                                            times its group's scale; x stays in its dtype
  M <= fp8_skinny_max_tokens   "skinny"     weight-only: e4m3 tiles upcast to x's dtype in registers,
                                            tensor-core products per K step, scaled per group in fp32
                               "skinny_mma" (KernelConfig.fp8_skinny_mma, up to 32 tokens, sm89+; a scale
                                            a row: bf16 x only) x quantized per token (and 128
                                            columns for block weights) by a kernel before it, e4m3 x
                                            e4m3 tensor-core products (kernels/fp8_skinny_mma.py)
  larger, KG == 1, CUDA bf16   "scaled_mm"  x quantized per token (or statically), cuBLASLt's FP8
                                            GEMM with a scale per row of each operand
  larger, 128 x 128 blocks,    "scaled_mm_block"  x quantized per token and 128 columns, cuBLASLt's
    CUDA bf16                               block-scaled FP8 GEMM (torch._scaled_mm, feature-detected
                                            once per device; the linear's compact block scales), or
                                            FlashInfer's DeepGEMM port on the same operands
                                            (KernelConfig.fp8_block_gemm_backend, kernels/fp8_deepgemm.py)
  larger otherwise             "gemm"       x quantized per token and group, a Triton FP8 tensor-core
                                            GEMM: acc += dot(a, b) * a_scale[m, kb] * w_scale[n, kb]

Decode wants its own paths: cuBLASLt's FP8 GEMM at 1-16 tokens reads at ~1.4 TB/s, no faster
than the bf16 GEMV reading twice the bytes (../shared/gpu/FLASHINFER.md), and its block-scaled
GEMM takes ~19 us at any M up to 128 for Llama-3-8B's o (bf16: ~13). At 1-2 tokens the GEMV is
weight-only; at 3-32 "skinny_mma" quantizes x per token (and 128 columns for block weights: the
prefill paths' arithmetic, as vLLM's FP8 linears at every size) where it fits, the weight-only "skinny" kernel
otherwise (or with KernelConfig.fp8_skinny_mma off); at 17-32 tokens, past fp8_skinny_max_tokens, skinny_mma
takes the place of the cuBLASLt GEMMs. Where
torch._scaled_mm refuses block-wise scales (before CUDA 12.9), the Triton GEMM takes them (about
2.4x slower at 4k tokens, benchmarks/RESULTS.md). Off CUDA, fp8_linear runs the torch reference;
the kernels themselves run on any device under Triton's interpreter (the tests call them there).
gate_up's SiLU-and-mul is fused into the weight-only kernels' epilogue (each product rounded to
the dtype first, as the unfused pair); the prefill paths run the GEMM, then silu_and_mul.

On the "scaled_mm_block" path the activation may come quantized by the kernel that produced it
(a QuantizedActivation from kernels/fp8_act.py: the norm before qkv / gate_up, SiLU-and-mul before
down), which saves the bf16 round trip and a kernel per linear: takes_quantized_input tells the
producer whether the linear will take that path at the step's size, fp8_linear multiplies such an
input as it comes (fp8_linear_quantized), fp8_gate_up_silu(quant_group=...) returns one for down.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from loguru import logger

from model_wrapper.kernels.activation import silu_and_mul
from model_wrapper.kernels.common import DEFAULT, launch_args, skinny_rows, skinny_store, uses_pdl
from model_wrapper.kernels import fp8_deepgemm
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.fp8_act import (  # noqa: F401 (fp8.quantize_*, fp8.round_to_e4m3: their old home)
    MAX_NORM_COLS, _quantize, _unit_cols, quantize_fp8_per_token_group, quantize_fp8_static, round_to_e4m3,
    silu_and_mul_fp8)
from model_wrapper.kernels.fp8_gemv import fp8_gemv, gemv_padded_k  # noqa: F401 (fp8.fp8_gemv: the "gemv" path)
from model_wrapper.kernels.fp8_skinny_mma import MAX_TOKENS, act_group, fp8_skinny_mma, skinny_mma_fits
from model_wrapper.kernels.fp8_reference import QuantizedActivation, fp8_gate_up_silu_reference, fp8_linear_reference
from model_wrapper.layers.fp8_linear import runs_e4m3


# -- weight-only skinny tensor-core GEMM (up to fp8_skinny_max_tokens tokens) ---------------------

@triton.jit
def _fp8_skinny_kernel(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, M, N, K: tl.constexpr, stride_x, stride_w, stride_s,
                   stride_o, GROUP: tl.constexpr, SUB: tl.constexpr, PER_GROUP: tl.constexpr, DEQUANT: tl.constexpr,
                   BM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SILU: tl.constexpr, PDL: tl.constexpr, F32_UPCAST: tl.constexpr):
    # W rows as the MMA's M side, the tokens padded to BM as its N side (kernels/gemm.py's skinny
    # GEMM). PER_GROUP: a K step of BLOCK_K holds NG = BLOCK_K // SUB sub-steps of SUB columns,
    # SUB dividing GROUP, so each sub-step has one scale per row:
    #
    #   k ... k+SUB ... k+2*SUB ... k+BLOCK_K       scale of sub-step j: weight_scale[n, (k + j*SUB) // GROUP]
    #   |  j=0  |  j=1  |  ...  |  j=NG-1 |
    #
    # DEQUANT: the [rows, BLOCK_K] e4m3 tile is scaled in registers (fp32 product, rounded to x's
    # dtype: the bf16 model's dequantized weight) and enters one product; otherwise (exact) each
    # sub-step is its own product of the upcast e4m3 tile, scaled in fp32 before it joins the sum.
    # Without PER_GROUP one scale per row, applied at the end; F32_UPCAST: the e4m3 tile goes to x's
    # dtype through fp32 (cvt e4m3x2 -> f16x2, then to fp32 and a packed round to bf16, as the scaled
    # tiles above) instead of Triton's direct e4m3 -> bf16 (a cvt to f16x2 and one F2F a value, a slow
    # pipe: per-channel o at 16 tokens took 22.7 us against the block-scaled tile's 15.3, H100, session 39).
    ROWS: tl.constexpr = BLOCK_N // 2 if SILU else BLOCK_N
    NG: tl.constexpr = BLOCK_K // SUB
    rows, live, w_rows, s_rows, toks, tok_ok = skinny_rows(w_ptr, s_ptr, stride_w, stride_s, N, M, ROWS, BM, PDL)
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros([ROWS, BM], dtype=tl.float32)
    up = tl.zeros([ROWS, BM], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if PER_GROUP and not DEQUANT:
            for j in tl.static_range(NG):
                kk = k + j * SUB + tl.arange(0, SUB)
                k_ok = kk < K
                xt = tl.trans(tl.load(x_ptr + toks[:, None] * stride_x + kk[None, :],
                                      mask=tok_ok[:, None] & k_ok[None, :], other=0.0))
                g_ok = k + j * SUB < K
                w = tl.load(w_rows + kk[None, :], mask=k_ok[None, :], other=0.0).to(dt)  # e4m3 -> 16-bit: exact
                acc += tl.dot(w, xt) * tl.load(s_rows + (k + j * SUB) // GROUP, mask=g_ok, other=0.0)[:, None]
                if SILU:
                    wu = tl.load(w_rows + N * stride_w + kk[None, :], mask=k_ok[None, :], other=0.0).to(dt)
                    su = tl.load(s_rows + N * stride_s + (k + j * SUB) // GROUP, mask=g_ok, other=0.0)
                    up += tl.dot(wu, xt) * su[:, None]
        else:
            kk = k + tl.arange(0, BLOCK_K)
            k_ok = kk < K
            xt = tl.trans(tl.load(x_ptr + toks[:, None] * stride_x + kk[None, :],
                                  mask=tok_ok[:, None] & k_ok[None, :], other=0.0))
            w = tl.load(w_rows + kk[None, :], mask=k_ok[None, :], other=0.0)
            if SILU:
                wu = tl.load(w_rows + N * stride_w + kk[None, :], mask=k_ok[None, :], other=0.0)
            if PER_GROUP:
                gk = k + tl.arange(0, NG) * SUB  # first column of each sub-step
                g_at = s_rows[:, None] + (gk // GROUP)[None, :]
                g_ok = (gk < K)[None, :]
                w = _scale_tile(w, tl.load(g_at, mask=g_ok, other=0.0), ROWS, NG, SUB, dt)
                if SILU:
                    wu = _scale_tile(wu, tl.load(g_at + N * stride_s, mask=g_ok, other=0.0), ROWS, NG, SUB, dt)
            elif F32_UPCAST:  # e4m3 -> fp32 -> dt: Triton's direct e4m3 -> bf16 takes a slow pipe (see below)
                w = w.to(tl.float32)
                if SILU:
                    wu = wu.to(tl.float32)
            acc = tl.dot(w.to(dt), xt, acc)
            if SILU:
                up = tl.dot(wu.to(dt), xt, up)
    if not PER_GROUP:
        acc *= tl.load(s_rows)[:, None]
        if SILU:
            up *= tl.load(s_rows + N * stride_s)[:, None]
    skinny_store(acc, up, b_ptr, o_ptr, rows, live, toks, tok_ok, N, stride_o, HAS_BIAS, SILU)


@triton.jit
def _scale_tile(w, s, ROWS: tl.constexpr, NG: tl.constexpr, SUB: tl.constexpr, dt: tl.constexpr):
    """e4m3 w [ROWS, NG * SUB] times s [ROWS, NG] (a scale per row and SUB columns), in fp32,
    rounded to dt."""
    w3 = tl.reshape(w.to(tl.float32), [ROWS, NG, SUB]) * s[:, :, None]
    return tl.reshape(w3, [ROWS, NG * SUB]).to(dt)


def _k_step(K: int, group: int, most: int) -> int | None:
    """The scale-group step of a tensor-core path: a power of 2 of at least 32 (an e4m3 MMA's K)
    that divides the scale group, at most `most` (any, with one group a row); None where none does."""
    if group >= K:
        return most
    step = min(most, group & -group)  # the largest power of 2 dividing group
    return step if step >= 32 else None


_SKINNY_SMEM = 200 * 1024  # bytes of shared memory the skinny kernel's pipeline stages may take


def _skinny_launch(M: int, n_out: int, K: int, group: int, silu: bool, cfg: KernelConfig) -> dict:
    """The skinny kernel's tiling for M tokens: BLOCK_K and SUB (a sub-step of one scale a row,
    dividing the group), rows a program (BLOCK_N halving from cfg.fp8_skinny_block_n until
    cfg.fp8_skinny_min_programs programs), warps and stages (BM > 16: the fp8_skinny_wide_* set);
    BLOCK_K halves where the stages would overflow shared memory (wide token tiles)."""
    bm = max(16, triton.next_power_of_2(M))
    wide = bm > 16
    block_k = cfg.fp8_skinny_wide_block_k if wide else cfg.fp8_skinny_block_k
    sub = _k_step(K, group, block_k)  # a power of 2 up to block_k, so it divides block_k
    block_n = cfg.fp8_skinny_block_n
    least = cfg.fp8_skinny_wide_min_programs if wide else cfg.fp8_skinny_min_programs
    while block_n > 16 and triton.cdiv(n_out, block_n // 2 if silu else block_n) < least:
        block_n //= 2
    if silu:
        block_n = max(block_n, 32)  # its halves (gate, up) are products of at least 16 rows
    stages = cfg.fp8_skinny_wide_stages if wide else cfg.fp8_skinny_stages
    # a stage holds e4m3 rows and the x tile (2-byte): halve the K step until the stages fit
    # shared memory (228 KB an SM on Hopper, with room left for the compiler's own)
    k_floor = sub if group < K else 32  # a K step holds whole sub-steps
    while block_k > k_floor and stages * block_k * (block_n + 2 * bm) > _SKINNY_SMEM:
        block_k //= 2
    return dict(BM=bm, BLOCK_N=block_n, BLOCK_K=block_k, SUB=sub if group < K else block_k,
                DEQUANT=cfg.fp8_skinny_wide_dequant if wide else cfg.fp8_skinny_dequant,
                num_warps=cfg.fp8_skinny_wide_warps if wide else cfg.fp8_skinny_warps, num_stages=stages)


def fp8_skinny(x, weight, weight_scale, group, bias=None, silu=False, cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """The "skinny" path: x [M, K] bf16 / fp16 (M <= 128, unit column stride) -> [M, N] (silu: [M, N // 2])."""
    M, K = x.shape
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(M, n_out, dtype=x.dtype, device=x.device)
    if not M:
        return out
    launch = _skinny_launch(M, n_out, K, group, silu, cfg)
    rows = launch["BLOCK_N"] // 2 if silu else launch["BLOCK_N"]
    pdl = uses_pdl(x.device, cfg)
    _fp8_skinny_kernel[(triton.cdiv(n_out, rows),)](
        x, weight, weight_scale, x if bias is None else bias, out, M, n_out, K, x.stride(0), weight.stride(0),
        weight_scale.stride(0), out.stride(0), GROUP=group, PER_GROUP=group < K, HAS_BIAS=bias is not None,
        SILU=silu, PDL=pdl, F32_UPCAST=cfg.fp8_skinny_f32_upcast, **launch, **launch_args(pdl))
    return out


# -- prefill: quantized activations ---------------------------------------------------------------

@triton.jit
def _fp8_gemm_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, b_ptr, o_ptr, M, N, K, stride_a, stride_asm, stride_ask, stride_w,
                 stride_ws, stride_o, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr):
    # a [M, K] e4m3 with scales [M, KG] (strides 0 for a static scale), w [N, K] e4m3 with [N, KG];
    # BK divides GROUP (or GROUP >= K): a K step has one scale per row of each operand, applied to
    # the step's FP8 product before it joins the fp32 sum. Tiles walked in GROUP_M-row bands.
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(N, BN)
    band = GROUP_M * n_blocks
    first = (pid // band) * GROUP_M
    rows_in_band = min(tl.cdiv(M, BM) - first, GROUP_M)
    pm = first + (pid % band) % rows_in_band
    pn = (pid % band) // rows_in_band
    offs_m = pm * BM + tl.arange(0, BM)
    offs_n = pn * BN + tl.arange(0, BN)
    m_ok = offs_m < M
    n_ok = offs_n < N
    sm = tl.where(m_ok, offs_m, 0).to(tl.int64)
    sn = tl.where(n_ok, offs_n, 0).to(tl.int64)
    ks = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        kk = k + ks
        k_ok = kk < K
        a = tl.load(a_ptr + sm[:, None] * stride_a + kk[None, :], mask=k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + sn[:, None] * stride_w + kk[None, :], mask=k_ok[None, :], other=0.0)
        a_s = tl.load(as_ptr + sm * stride_asm + (k // GROUP) * stride_ask)
        w_s = tl.load(ws_ptr + sn * stride_ws + k // GROUP)
        acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * w_s[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(o_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def fp8_gemm(x, weight, weight_scale, group, bias=None, input_scale=None, cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """The "gemm" path: x [M, K] quantized per token and group (or with input_scale), then the
    block-scaled FP8 GEMM -> [M, N] in x's dtype. K step: the largest power of 2 up to 128
    dividing group (fp8_path sends a group with none of at least 32 to the reference)."""
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if not M:
        return out
    a, a_s = _quantize(_unit_cols(x), group, input_scale, cfg=cfg)
    bm, bn = cfg.fp8_gemm_block_m, cfg.fp8_gemm_block_n
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _fp8_gemm_kernel[grid](a, a_s, weight, weight_scale, x if bias is None else bias, out, M, N, K, a.stride(0),
                       a_s.stride(0), a_s.stride(1), weight.stride(0), weight_scale.stride(0), out.stride(0),
                       GROUP=group, BM=bm, BN=bn, BK=_k_step(K, group, 128), GROUP_M=cfg.fp8_gemm_group_m,
                       HAS_BIAS=bias is not None, num_warps=cfg.fp8_gemm_warps, num_stages=cfg.fp8_gemm_stages)
    return out


def fp8_scaled_mm(x, weight, weight_scale, bias=None, input_scale=None, cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """The "scaled_mm" path (KG == 1): x quantized per token (or with input_scale), then
    torch._scaled_mm with scale_a [M, 1] and the weight's row scales as scale_b [1, N]; the bias
    added after (the row-wise kernels' bias support varies by torch version) -> [M, N] bf16.
    cfg.fp8_fast_accum: cuBLASLt's fast accumulation (_rowwise_mm)."""
    M, K = x.shape
    a, a_s = _quantize(_unit_cols(x), K, input_scale, cfg=cfg)
    return _rowwise_mm(a, a_s, M, weight, weight_scale, bias, x.dtype, cfg)


def _rowwise_mm(a, a_s, M, weight, weight_scale, bias, out_dtype, cfg: KernelConfig) -> torch.Tensor:
    """e4m3 a [M', K] (rows M.. dropped) times weight^T with scale_a [M', 1] and the weight's row scales.
    cfg.fp8_fast_accum: use_fast_accum (Hopper's FP8 tensor cores then keep the running sum in their
    own narrower accumulator between K steps instead of promoting it to fp32 every few steps)."""
    N = weight.shape[0]
    if a.shape[0] != M:
        a, a_s = a[:M], a_s[:M]
    y = torch._scaled_mm(a, weight.t(), scale_a=a_s.contiguous(), scale_b=weight_scale.reshape(1, N).contiguous(),
                         out_dtype=out_dtype, use_fast_accum=cfg.fp8_fast_accum)
    return y if bias is None else y.add_(bias)


def fp8_scaled_mm_block(x, weight, block_scale, bias=None, cfg: KernelConfig | None = None) -> torch.Tensor:
    """The "scaled_mm_block" path (block-format weights, group 128): x quantized per token and 128
    columns, then torch._scaled_mm with block-wise scales -> [M, N] in x's dtype:

        scale_a  float32 [M', K / 128], stride(0) == 1   (cuBLASLt's 1 x 128 activation blocks)
        scale_b  block_scale float32 [K / 128, N / 128]  (128 x 128 weight blocks; Fp8Method.block_scale)

    M is padded to a multiple of 16 (M'; zero rows) for the scale layout's leading dimension.
    cfg.fp8_block_gemm_backend may send the product to FlashInfer's DeepGEMM port instead
    (kernels/fp8_deepgemm.py: the same operands and layouts); cfg None: cuBLASLt."""
    M, K = x.shape
    mp = -(-M // 16) * 16
    a, a_s = _quantize(_unit_cols(x), 128, None, rows=mp, outer=True, cfg=DEFAULT if cfg is None else cfg)
    return _block_mm(a, a_s, M, weight, block_scale, bias, x.dtype, cfg)


def fp8_linear_quantized(act: QuantizedActivation, weight: torch.Tensor, block_scale: torch.Tensor | None,
                         bias: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None,
                         cfg: KernelConfig = DEFAULT, group: int | None = None) -> torch.Tensor:
    """The GEMM of an activation its producer quantized (kernels/fp8_act.py), act.q [Mp, K] e4m3 ->
    [act.rows, N] in act.dtype: "skinny_mma" where path_for sends act's rows there (group: the weight's
    scale group; quantized_input_group asks for an activation there only where that path runs);
    else "scaled_mm_block" for act.scale [Mp, K / 128] (stride(0) == 1) and a weight with 128 x 128
    block_scale; "scaled_mm" for act.scale [Mp, 1] (one scale a token, group K) and weight_scale
    [N, 1] (one a row)."""
    K = act.q.shape[1]
    if _quantized_skinny(act, weight, weight_scale, group, cfg):
        return fp8_skinny_mma(act, weight, weight_scale, group, bias, cfg=cfg)
    if act.group == 128 and block_scale is not None:
        return _block_mm(act.q, act.scale, act.rows, weight, block_scale, bias, act.dtype, cfg)
    if act.group == K and weight_scale is not None and weight_scale.shape[1] == 1:
        return _rowwise_mm(act.q, act.scale, act.rows, weight, weight_scale, bias, act.dtype, cfg)
    raise ValueError(f"fp8_linear_quantized: expected 128-column activation groups and a weight with 128 x 128 "
                     f"block scales, or one group a token (group {K}) and one weight scale a row; got group "
                     f"{act.group}, block scales {None if block_scale is None else tuple(block_scale.shape)}, "
                     f"weight scales {None if weight_scale is None else tuple(weight_scale.shape)}")


def _quantized_skinny(act: QuantizedActivation, weight: torch.Tensor, weight_scale: torch.Tensor | None,
                      group: int | None, cfg: KernelConfig) -> bool:
    """Whether the step of act's rows runs "skinny_mma" on this weight (its producer then quantized it
    for that path: quantized_input_group)."""
    return (group is not None and weight_scale is not None and act.rows <= mma_max_tokens(weight.shape[1], group, cfg)
            and path_for(act.rows, act.dtype, weight.device, weight, weight_scale, group, cfg) == "skinny_mma")


def _block_mm(a, a_s, M, weight, block_scale, bias, out_dtype, cfg: KernelConfig | None) -> torch.Tensor:
    """e4m3 a [Mp, K] with scales [Mp, K / 128] (stride(0) == 1) times weight^T with block_scale
    [K / 128, N / 128] -> [M, N]: FlashInfer's DeepGEMM port where cfg.fp8_block_gemm_backend and
    fp8_deepgemm.wants say so, else cuBLASLt (torch._scaled_mm)."""
    if cfg is not None and fp8_deepgemm.wants(cfg, a.device, out_dtype, weight.shape[0], weight.shape[1], a.shape[0]):
        y = fp8_deepgemm.block_mm(a, a_s, M, weight, block_scale)
        if y is not None:  # (None: its runner raised, logged; cuBLASLt below)
            return y if bias is None else y.add_(bias)
    y = torch._scaled_mm(a, weight.t(), scale_a=a_s, scale_b=block_scale, out_dtype=out_dtype)
    y = y[:M] if a.shape[0] != M else y
    return y if bias is None else y.add_(bias)


_BLOCK_MM: dict = {}  # (device, N, K) -> whether torch._scaled_mm takes block scales there


def _block_mm_works(device: torch.device, N: int, K: int) -> bool:
    """Whether torch._scaled_mm takes 128 x 128 block scales for [N, K] weights on `device`
    (cuBLASLt >= 12.9 on sm90; torch 2.11 does): one trial product of that shape against the
    same quantized operands, once per shape (never inside a CUDA graph capture: it reads the
    result). A refusal is logged with its reason and the Triton GEMM takes the shape."""
    key = (device, N, K)
    if key not in _BLOCK_MM:
        if device.type != "cuda" or not _fp8_mma(device) or N % 128 or K % 128:
            return False
        if torch.cuda.is_current_stream_capturing():
            return False
        _BLOCK_MM[key] = _try_block_mm(device, N, K)
    return _BLOCK_MM[key]


def _try_block_mm(device: torch.device, N: int, K: int) -> bool:
    g = torch.Generator(device=device).manual_seed(0)
    w = torch.randint(-64, 64, (N, K), device=device, generator=g, dtype=torch.int8).to(torch.float8_e4m3fn)
    blocks = torch.rand(N // 128, K // 128, device=device, generator=g) + 0.5
    x = torch.randn(16, K, device=device, generator=g).to(torch.bfloat16)
    try:
        got = fp8_scaled_mm_block(x, w, blocks.t())[:, :256].float()
    except Exception as e:  # noqa: BLE001 (any refusal of the library means: not here)
        logger.warning(f"torch._scaled_mm refuses 128x128 block scales for [{N}, {K}] weights ({e!r:.300}); "
                       "the Triton FP8 GEMM takes them")
        return False
    q, qs = quantize_fp8_per_token_group(x, 128)
    xd = q.float() * qs.repeat_interleave(128, dim=1)
    wd = w[:256].float() * blocks[:2].repeat_interleave(128, 0).repeat_interleave(128, 1)
    want = xd @ wd.t()
    err = float((got - want).abs().max() / want.abs().max())
    if err > 0.02:
        logger.warning(f"torch._scaled_mm with block scales is {err:.3g} off for [{N}, {K}] weights; "
                       "the Triton FP8 GEMM takes them")
    return err <= 0.02


def scaled_mm_block_fits(x: torch.Tensor, weight: torch.Tensor, block_scale: torch.Tensor | None) -> bool:
    """Whether the "scaled_mm_block" path takes x: the linear has compact block scales (block
    format, group 128, N and K multiples of 128), x bf16 on a GPU whose torch._scaled_mm takes them."""
    return _block_fits(x.dtype, x.device, weight, block_scale)


def _block_fits(dtype: torch.dtype, device: torch.device, weight: torch.Tensor,
                block_scale: torch.Tensor | None) -> bool:
    return (block_scale is not None and device.type == "cuda" and dtype == torch.bfloat16 and weight.is_contiguous()
            and _block_mm_works(device, *weight.shape))


def _fp8_mma(device: torch.device) -> bool:
    """Whether `device` multiplies e4m3 operands: sm89+ (runs_e4m3; and any device under the interpreter)."""
    return device.type != "cuda" or runs_e4m3(device)


def _scaled_mm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """cuBLASLt's row-wise FP8 GEMM: sm89+, bf16 output, K and N multiples of 16, weight row-major."""
    return _rowwise_fits(x.dtype, x.device, weight)


def _rowwise_fits(dtype: torch.dtype, device: torch.device, weight: torch.Tensor) -> bool:
    return (device.type == "cuda" and dtype == torch.bfloat16 and _fp8_mma(device) and weight.shape[1] % 16 == 0
            and weight.shape[0] % 16 == 0 and weight.is_contiguous())


# -- the entry points -----------------------------------------------------------------------------

def fp8_path(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, group: int,
             cfg: KernelConfig = DEFAULT, silu: bool = False, block_scale: torch.Tensor | None = None) -> str:
    """Which path fp8_linear takes on a CUDA x: "gemv", "skinny", "skinny_mma", "scaled_mm", "scaled_mm_block",
    "gemm" or "reference" (a scale group no tensor-core K step divides, x in neither bf16 nor fp16,
    or a prefill step on a GPU without e4m3 tensor cores, before sm89)."""
    return path_for(x.shape[0], x.dtype, x.device, weight, weight_scale, group, cfg, silu, block_scale)


def attention_output_group(M: int, dtype: torch.dtype, device: torch.device, weight: torch.Tensor,
                           weight_scale: torch.Tensor, group: int, cfg: KernelConfig = DEFAULT) -> int | None:
    """The column group (128) in which the decode attention's split merge may quantize this linear's input of M rows
    (decode_attention.merge_splits(quant=True): per token and head), where the step runs "skinny_mma" on block
    weights (the prefill paths take cuBLASLt's padded layout, which the merge does not write) and
    cfg.fp8_attention_out_quant is on; else None."""
    K = weight.shape[1]
    if (not cfg.fp8_attention_out_quant or device.type != "cuda" or group >= K or M > mma_max_tokens(K, group, cfg)
            or path_for(M, dtype, device, weight, weight_scale, group, cfg) != "skinny_mma"):
        return None
    return act_group(K, group)


def mma_max_tokens(K: int, group: int, cfg: KernelConfig = DEFAULT) -> int:
    """The most tokens "skinny_mma" takes for a weight of K columns and scale group `group`: block scales
    cfg.fp8_skinny_mma_max_tokens, a scale a row cfg.fp8_skinny_mma_row_max_tokens (at most its 64-token tile)."""
    return min(cfg.fp8_skinny_mma_max_tokens if group < K else cfg.fp8_skinny_mma_row_max_tokens, MAX_TOKENS)


def path_for(M: int, dtype: torch.dtype, device: torch.device, weight: torch.Tensor, weight_scale: torch.Tensor,
             group: int, cfg: KernelConfig = DEFAULT, silu: bool = False,
             block_scale: torch.Tensor | None = None) -> str:
    """fp8_path for an input of M rows in dtype on device (K: the weight's): also the decision ahead
    of the kernel that will produce the input (takes_quantized_input)."""
    K = weight.shape[1]
    if dtype not in (torch.bfloat16, torch.float16):
        return "reference"
    mma = (cfg.fp8_skinny_mma and M <= mma_max_tokens(K, group, cfg) and skinny_mma_fits(K, group)
           and _fp8_mma(device) and (group < K or dtype == torch.bfloat16))  # a scale a row: bf16 only
    if M <= cfg.fp8_gemv_max_tokens and gemv_padded_k(K, group, cfg) * (2 if silu else 1) <= cfg.fp8_gemv_max_k:
        # several tokens: weights of more than fp8_gemv_multi_token_max_weights go to skinny_mma where it runs
        if M == 1 or not mma or weight.numel() <= cfg.fp8_gemv_multi_token_max_weights:
            return "gemv"
    if _k_step(K, group, cfg.fp8_skinny_block_k) is None:
        return "reference"
    if mma:
        return "skinny_mma"  # (kernels/fp8_skinny_mma.py)
    if M <= cfg.fp8_skinny_max_tokens:
        return "skinny"
    if weight_scale.shape[1] == 1 and _rowwise_fits(dtype, device, weight):
        return "scaled_mm"
    if _block_fits(dtype, device, weight, block_scale):
        return "scaled_mm_block"
    return "gemm" if _fp8_mma(device) else "reference"


def takes_quantized_input(M: int, dtype: torch.dtype, device: torch.device, weight: torch.Tensor,
                          weight_scale: torch.Tensor, block_scale: torch.Tensor | None,
                          cfg: KernelConfig = DEFAULT) -> bool:
    """Whether fp8_linear would quantize an M-row input (dtype, on device) per token and 128
    columns for the "scaled_mm_block" GEMM: then the kernel producing the input may quantize it
    instead (a QuantizedActivation, which fp8_linear multiplies as it comes). cfg.fp8_fused_act_quant
    off, or block_scale None (no block format, or a static input scale): False."""
    if not cfg.fp8_fused_act_quant or block_scale is None or device.type != "cuda" or M <= cfg.fp8_skinny_max_tokens:
        return False  # (up to fp8_skinny_max_tokens: the weight-only paths, which take x unquantized)
    return path_for(M, dtype, device, weight, weight_scale, 128, cfg, block_scale=block_scale) == "scaled_mm_block"


def quantized_input_group(M: int, dtype: torch.dtype, device: torch.device, weight: torch.Tensor,
                          weight_scale: torch.Tensor, block_scale: torch.Tensor | None,
                          cfg: KernelConfig = DEFAULT, group: int | None = None) -> int | None:
    """The column group by which the kernel producing an M-row input may quantize it for this
    linear (a QuantizedActivation, which fp8_linear multiplies as it comes), or None: 128 where
    takes_quantized_input (the block-scaled GEMM); K (one scale a token) where the step runs the
    row-wise "scaled_mm" path (one weight scale a row, dynamic activations) and
    cfg.fp8_fused_act_quant_per_token is on, for rows a producer's program holds whole
    (fp8_act.MAX_NORM_COLS). Where the step runs "skinny_mma" for a weight of scale
    group `group` and cfg.fp8_skinny_mma_fused_quant is on: that path's own quantization of x
    (fp8_skinny_mma.act_group: 128, or K for a scale a weight row)."""
    if takes_quantized_input(M, dtype, device, weight, weight_scale, block_scale, cfg):
        return 128
    K = weight.shape[1]
    if (group is not None and cfg.fp8_skinny_mma_fused_quant and device.type == "cuda"
            and path_for(M, dtype, device, weight, weight_scale, group, cfg) == "skinny_mma"):
        return act_group(K, group)
    if (not cfg.fp8_fused_act_quant_per_token or device.type != "cuda" or M <= cfg.fp8_skinny_max_tokens
            or weight_scale.shape[1] != 1 or triton.next_power_of_2(K) > MAX_NORM_COLS):
        return None
    return K if path_for(M, dtype, device, weight, weight_scale, K, cfg) == "scaled_mm" else None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, group: int,
               bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
               cfg: KernelConfig = DEFAULT, block_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T (+ bias) -> [M, N] in x's dtype, W = e4m3 weight [N, K] * weight_scale [N, KG]
    per row and group of `group` columns. The weight-only paths ("gemv", "skinny") leave x
    unquantized and ignore input_scale, "skinny_mma" quantizes x per token (and 128 columns for
    block weights) and ignores input_scale too; larger steps quantize x per token and group, or
    with input_scale. block_scale: the same scales as [K / 128, N / 128] blocks where the weight
    has them (Fp8Method.block_scale; None: no cuBLASLt block path). Off CUDA: the torch reference
    (weight-only up to fp8_skinny_max_tokens, quantized beyond)."""
    if isinstance(x, QuantizedActivation):  # quantized by its producer (quantized_input_group said so)
        return fp8_linear_quantized(x, weight, block_scale, bias, weight_scale, cfg, group)
    if input_scale is not None:
        block_scale = None  # static activations: one scale, not per token and group
    path = fp8_path(x, weight, weight_scale, group, cfg, block_scale=block_scale) if x.is_cuda else "reference"
    x = _unit_cols(x)
    if path == "scaled_mm_block":
        return fp8_scaled_mm_block(x, weight, block_scale, bias, cfg)
    if path == "gemv":
        return fp8_gemv(x, weight, weight_scale, group, bias, cfg=cfg)
    if path == "skinny":
        return fp8_skinny(x, weight, weight_scale, group, bias, cfg=cfg)
    if path == "skinny_mma":
        return fp8_skinny_mma(x, weight, weight_scale, group, bias, cfg=cfg)
    if path == "scaled_mm":
        return fp8_scaled_mm(x, weight, weight_scale, bias, input_scale, cfg)
    if path == "gemm":
        return fp8_gemm(x, weight, weight_scale, group, bias, input_scale, cfg)
    weight_only = x.shape[0] <= cfg.fp8_skinny_max_tokens
    return fp8_linear_reference(x, weight, weight_scale, group, bias, not weight_only, input_scale)


def fp8_gate_up_silu(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, group: int,
                     bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
                     cfg: KernelConfig = DEFAULT, block_scale: torch.Tensor | None = None,
                     quant_group: int | None = None):
    """silu(gate) * up [M, N // 2] of fp8_linear over gate_up rows [gate | up] (weight [N, K], its
    scales [N, KG] and bias [N] gate rows first): fused into the weight-only kernels' epilogue;
    the prefill paths run the GEMM, then silu_and_mul. quant_group (the down projection takes a
    quantized input, takes_quantized_input, and this step runs a prefill path): SiLU-and-mul and
    down's quantization in one kernel -> a QuantizedActivation instead."""
    if isinstance(x, QuantizedActivation):  # (quantized_input_group: skinny_mma's rows, else a prefill GEMM's)
        path = "skinny_mma" if _quantized_skinny(x, weight, weight_scale, group, cfg) else "scaled_mm_block"
    else:
        path = fp8_path(x, weight, weight_scale, group, cfg, silu=True) if x.is_cuda else "reference"
        x = _unit_cols(x)
    if path == "gemv":
        return fp8_gemv(x, weight, weight_scale, group, bias, silu=True, cfg=cfg)
    if path == "skinny":
        return fp8_skinny(x, weight, weight_scale, group, bias, silu=True, cfg=cfg)
    if path == "skinny_mma":
        return fp8_skinny_mma(x, weight, weight_scale, group, bias, silu=True, cfg=cfg)
    if path == "reference":
        weight_only = x.shape[0] <= cfg.fp8_skinny_max_tokens
        return fp8_gate_up_silu_reference(x, weight, weight_scale, group, bias, not weight_only, input_scale)
    gate_up = fp8_linear(x, weight, weight_scale, group, bias, input_scale, cfg, block_scale)
    if quant_group is not None:
        return silu_and_mul_fp8(gate_up, quant_group, cfg=cfg)
    return silu_and_mul(gate_up, cfg)
