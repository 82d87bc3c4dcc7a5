"""The FP8 linears' activation quantization (kernels/fp8.py's prefill paths): per token and group
of columns (or with a static scale) in a kernel of its own, or fused into the kernels that produce
the activations: the residual add + RMSNorm before qkv and gate_up, the SiLU-and-mul before down.

    quantize_fp8_per_token_group(x, group)  -> (x_fp8 [M, K], scale [M, KG])
    quantize_fp8_static(x, input_scale)     -> x_fp8 [M, K]

kernels/fp8.py's "scaled_mm_block" path (cuBLASLt's block-scaled GEMM, 17+ tokens) multiplies
e4m3 activations quantized per token and 128 columns. Unfused, a prefill layer runs a norm that
writes x in bf16, then a quantize kernel that reads it back (and the same after SiLU-and-mul,
whose bf16 output is the widest activation of the layer). Here the producer quantizes the values
it computed, still in registers, and writes only e4m3 + scales:

    add_rms_norm_fp8(x, residual, weight, eps, group)  residual <- residual + x (in place),
                                                       -> quantize(weight * RMSNorm(residual))
    add_rms_norm_fp8(x, None, weight, eps, group)      -> quantize(weight * RMSNorm(x))  (first layer)
    silu_and_mul_fp8(gate_up, group)                   -> quantize(silu(gate) * up)

Each returns a QuantizedActivation (kernels/fp8_reference.py): e4m3 [Mp, K] and float32 scales
[Mp, KG] with stride(0) == 1 (cuBLASLt's layout of 1 x 128 activation blocks), Mp = M rounded up
to 16 (rows M.. are zeros with the scale of an all-zero group). The quantization is the reference
one (quantize_fp8_reference) applied to the value the unfused kernel would have written, rounded
to x's dtype first: scale = max(amax, MIN_AMAX) / 448 with IEEE divisions, x / scale clamped and
rounded to e4m3 ties-to-even. write_x also stores that bf16 value (tests).

The e4m3 rounding is the conversion with fp_downcast_rounding="rtne" (PTX cvt.rn.satfinite.e4m3x2.f32
on sm89+, one instruction for two values; under the interpreter torch's conversion, also ties to
even): round_to_e4m3's ~12 instructions a value made the SiLU-and-mul + quantize kernel instruction-
bound (58 SASS instructions an element, 2.0 TB/s on an H100 where SiLU-and-mul alone reads at 3.0).
round_to_e4m3 stays for the K/V store (kernels/kv_store.py), whose conversions go through fp16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, silu_mul
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.fp8_reference import FP8_MAX, MIN_AMAX, QuantizedActivation

ROW_PAD = 16  # Mp: the rows of the e4m3 operand and its scales, a multiple of 16 (cuBLASLt's scale layout)
MAX_NORM_COLS = 16384  # a norm program holds its whole row (padded to a power of 2) in registers


# -- the quantize kernel (a linear quantizes its own input) ----------------------------------------

@triton.jit
def round_to_e4m3(q):
    """fp32 q in [-448, 448] -> the nearest e4m3 value, ties to even, still fp32: the conversion
    after it is then exact whatever rounding the hardware's or the compiler's conversion does.

    e4m3 keeps 3 mantissa bits from exponent -6 up (biased fp32 exponent e >= 121), and spacing
    2^-9 below (subnormals): ulp = 2^(max(e, 121) - 127 - 3). q / ulp (an exact power-of-2
    product) lies in (-16, 16); adding and subtracting 1.5 * 2^23 rounds it to an integer, ties
    to even, in IEEE fp32 adds."""
    bits = q.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 121)
    ulp = ((e - 3) << 23).to(tl.float32, bitcast=True)
    inv = ((257 - e) << 23).to(tl.float32, bitcast=True)  # 1 / ulp
    r = ((q * inv + 12582912.0) - 12582912.0) * ulp
    # q's sign back on a result rounded to zero (the adds give +0): -0 stays -0, as torch's conversion
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def div_by_scale(y, s, RECIP: tl.constexpr):
    """y / s in IEEE fp32 (round to nearest even), s [BG, 1] > 0 one divisor a row of y [BG, GP]. RECIP (on a GPU):
    through the divisor's correctly rounded reciprocal r = 1 / s, one a row, and one correction of the product,
    q0 = y * r, q = q0 + (y - s * q0) * r, both in fused multiply-adds: Markstein's theorem (r within half an ulp
    of 1 / s, q0 within one ulp of y / s) makes q the correctly rounded quotient wherever it is a normal fp32
    number, with no per-value reciprocal, Newton steps and slow-path check of div.rn (below 2^-126 the two may
    differ in fp32, and both round to an e4m3 zero of y's sign). Where q0 is 0 (y = +-0, or the product
    underflows) q0 is kept: it has y's sign, which the adds would lose (-0); with s = inf (an inf in the group)
    r = 0 and q0 = +-0 = y / inf. Else (the interpreter, whose fma rounds the product) div.rn itself.
    tests/kernels/test_fp8_quant_division.py checks the sequence in exact arithmetic against torch's division."""
    if RECIP:
        r = tl.math.div_rn(1.0, s)
        q0 = y * r
        q = tl.fma(tl.fma(-s, q0, y), r, q0)
        return tl.where(q0 == 0.0, q0, q)
    return tl.math.div_rn(y, s)


@triton.jit
def _quantize_store(y, g, cols, m, row, q_ptr, s_ptr, stride_q, stride_s, stride_sg, GROUP: tl.constexpr, n,
                    FMAX: tl.constexpr, AMIN: tl.constexpr, RECIP: tl.constexpr):
    """y [BG, GP] fp32 (already rounded to the activation dtype; zeros outside m): per group row of
    the tile, scale = max(amax, AMIN) / FMAX and e4m3(clamp(y / scale)) stored at row `row` (RECIP:
    div_by_scale's reciprocal division, the same quotients)."""
    s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), axis=1), AMIN), FMAX)
    tl.store(s_ptr + row * stride_s + g * stride_sg, s, mask=g * GROUP < n)
    q = tl.minimum(tl.maximum(div_by_scale(y, s[:, None], RECIP), -FMAX), FMAX)
    tl.store(q_ptr + row * stride_q + cols, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=m)


@triton.jit
def _fp8_quantize_kernel(x_ptr, q_ptr, s_ptr, in_scale_ptr, M, K, stride_x, stride_q, stride_s, stride_sg,
                     GROUP: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, STATIC: tl.constexpr,
                     FMAX: tl.constexpr, AMIN: tl.constexpr, RECIP: tl.constexpr = False):
    # a program: one row, BG groups of GROUP columns as a [BG, GP] tile (GP = GROUP padded to a
    # power of 2); rows from M on (padding) quantize zeros: q = 0 with the scale of an all-zero group
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BG + tl.arange(0, BG)
    j = tl.arange(0, GP)
    cols = g[:, None] * GROUP + j[None, :]
    m = (j[None, :] < GROUP) & (cols < K)
    x = tl.load(x_ptr + row * stride_x + cols, mask=m & (row < M), other=0.0).to(tl.float32)
    if STATIC:
        # IEEE division (Triton's `/` is approximate on the GPU): the reference's rounding exactly
        q = tl.math.div_rn(x, tl.load(in_scale_ptr).to(tl.float32))
        q = tl.minimum(tl.maximum(q, -FMAX), FMAX)
        tl.store(q_ptr + row * stride_q + cols, q.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=m)
    else:  # a scale per group, as the fused producers below store it
        _quantize_store(x, g, cols, m, row, q_ptr, s_ptr, stride_q, stride_s, stride_sg, GROUP, K, FMAX, AMIN, RECIP)



def _quantize(x: torch.Tensor, group: int, input_scale: torch.Tensor | None, rows: int | None = None,
              outer: bool = False, cfg: KernelConfig = DEFAULT):
    """-> (q e4m3 [rows, K], s float32 [rows, KG]) of x [M, K] (rows >= M: zero rows after x's).
    outer: s is a view of a [KG, rows] buffer (stride(0) == 1: cuBLASLt's block-scale layout)."""
    M, K = x.shape
    rows = M if rows is None else rows
    kg = triton.cdiv(K, group)
    q = torch.empty(rows, K, dtype=torch.float8_e4m3fn, device=x.device)
    if input_scale is not None:
        s = input_scale.to(device=x.device, dtype=torch.float32).reshape(1, 1).expand(rows, kg)
    elif outer:
        s = torch.empty(kg, rows, dtype=torch.float32, device=x.device).t()
    else:
        s = torch.empty(rows, kg, dtype=torch.float32, device=x.device)
    if rows:
        gp = triton.next_power_of_2(group)
        bg = max(1, min(triton.next_power_of_2(kg), 4096 // gp))  # ~4k values a program
        _fp8_quantize_kernel[(rows, triton.cdiv(kg, bg))](
            x, q, s, s, M, K, x.stride(0), q.stride(0), s.stride(0), s.stride(1), GROUP=group, GP=gp, BG=bg,
            STATIC=input_scale is not None, FMAX=FP8_MAX, AMIN=MIN_AMAX, RECIP=_recip(x, cfg),
            num_warps=4 if bg * gp <= 4096 else 8)
    return q, s


def quantize_fp8_per_token_group(x: torch.Tensor, group: int, cfg: KernelConfig = DEFAULT
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit column stride) -> (x_fp8 e4m3 [M, K], scale float32 [M, ceil(K / group)]):
    per row and group of `group` columns, scale = max(amax, MIN_AMAX) / 448 and
    x_fp8 = e4m3(clamp(x / scale, -448, 448)), in one Triton kernel."""
    return _quantize(_unit_cols(x), group, None, cfg=cfg)


def quantize_fp8_static(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> e4m3(clamp(x / input_scale, -448, 448)) [M, K], input_scale a float32 scalar tensor."""
    return _quantize(_unit_cols(x), x.shape[1], input_scale)[0]


def _unit_cols(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


# -- fused into the producers -----------------------------------------------------------------------


@triton.jit
def _norm_quant_kernel(x_ptr, r_ptr, w_ptr, q_ptr, s_ptr, xo_ptr, M, n, stride_x, stride_r, stride_q, stride_s,
                       stride_sg, stride_xo, eps, GROUP: tl.constexpr, GP: tl.constexpr, KG: tl.constexpr,
                       HAS_RES: tl.constexpr, WRITE_X: tl.constexpr, FMAX: tl.constexpr, AMIN: tl.constexpr,
                       RECIP: tl.constexpr = False):
    # a program: one row as a [KG, GP] tile (KG groups, a power of 2, of GP = GROUP padded to a power
    # of 2); rows M.. (padding) read zeros and write only q = 0 and the all-zero group's scale
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, KG)
    j = tl.arange(0, GP)
    cols = g[:, None] * GROUP + j[None, :]
    m = (j[None, :] < GROUP) & (cols < n)
    ld = m & (row < M)
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=ld, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + cols, mask=ld, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the residual stream, rounded as the reference
        tl.store(r_ptr + row * stride_r + cols, x, mask=ld)
    xf = x.to(tl.float32)
    ms = tl.sum(tl.sum(xf * xf, axis=1), axis=0) / n
    h = (xf * tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))).to(dtype)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    y = (w.to(tl.float32) * h.to(tl.float32)).to(dtype)
    if WRITE_X:
        tl.store(xo_ptr + row * stride_xo + cols, y, mask=ld)
    _quantize_store(y.to(tl.float32), g, cols, m, row, q_ptr, s_ptr, stride_q, stride_s, stride_sg, GROUP, n,
                    FMAX, AMIN, RECIP)


@triton.jit
def _silu_quant_kernel(x_ptr, q_ptr, s_ptr, xo_ptr, M, n, stride_x, stride_q, stride_s, stride_sg, stride_xo,
                       GROUP: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, WRITE_X: tl.constexpr,
                       FMAX: tl.constexpr, AMIN: tl.constexpr, RECIP: tl.constexpr = False):
    # a program: one row, BG groups of the n outputs (gate columns 0..n, up columns n..2n)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BG + tl.arange(0, BG)
    j = tl.arange(0, GP)
    cols = g[:, None] * GROUP + j[None, :]
    m = (j[None, :] < GROUP) & (cols < n)
    ld = m & (row < M)
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ld, other=0.0)
    up = tl.load(x_ptr + row * stride_x + n + cols, mask=ld, other=0.0)
    y = silu_mul(gate, up).to(x_ptr.dtype.element_ty)  # silu_and_mul's output, rounded as it stores it
    if WRITE_X:
        tl.store(xo_ptr + row * stride_xo + cols, y, mask=ld)
    _quantize_store(y.to(tl.float32), g, cols, m, row, q_ptr, s_ptr, stride_q, stride_s, stride_sg, GROUP, n,
                    FMAX, AMIN, RECIP)


def _recip(x: torch.Tensor, cfg: KernelConfig) -> bool:
    """Whether the quantize kernels divide by the scale through its reciprocal (div_by_scale's RECIP): on a GPU,
    KernelConfig.fp8_quant_reciprocal."""
    return x.is_cuda and cfg.fp8_quant_reciprocal


def padded_rows(M: int) -> int:
    return -(-M // ROW_PAD) * ROW_PAD


def _outputs(M: int, n: int, group: int, device, dtype, write_x: bool):
    """(q e4m3 [Mp, n], scales [Mp, KG] as the transpose of a [KG, Mp] buffer, x [M, n] or None)."""
    mp, kg = padded_rows(M), triton.cdiv(n, group)
    q = torch.empty(mp, n, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(kg, mp, dtype=torch.float32, device=device).t()
    return q, s, torch.empty(M, n, dtype=dtype, device=device) if write_x else None


def norm_fp8_fits(x: torch.Tensor, group: int) -> bool:
    """Whether (add_)rms_norm_fp8 takes x [M, n]: a 16-bit float x with unit column stride, a
    power-of-2 group of at least 16, the padded row at most MAX_NORM_COLS."""
    return (x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16) and x.stride(-1) == 1
            and group >= 16 and group & (group - 1) == 0
            and triton.next_power_of_2(triton.cdiv(x.shape[1], group)) * group <= MAX_NORM_COLS)


def add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, group: int,
                     write_x: bool = False, cfg: KernelConfig = DEFAULT) -> QuantizedActivation:
    """residual <- residual + x in place (residual None: the norm of x itself), -> the e4m3
    quantization, per row and `group` columns, of weight * RMSNorm(residual) rounded to x's dtype.
    x, residual [M, n] (unit column stride), weight [n]; norm_fp8_fits(x, group) must hold.
    write_x: the QuantizedActivation also holds that normed x [M, n] (otherwise not written)."""
    M, n = x.shape
    q, s, xo = _outputs(M, n, group, x.device, x.dtype, write_x)
    r = x if residual is None else residual
    kg = triton.next_power_of_2(triton.cdiv(n, group))
    _norm_quant_kernel[(q.shape[0],)](
        x, r, weight, q, s, q if xo is None else xo, M, n, x.stride(0), r.stride(0), q.stride(0), s.stride(0),
        s.stride(1), 0 if xo is None else xo.stride(0), eps, GROUP=group, GP=group, KG=kg,
        HAS_RES=residual is not None, WRITE_X=write_x, FMAX=FP8_MAX, AMIN=MIN_AMAX, RECIP=_recip(x, cfg),
        num_warps=8 if kg * group >= 4096 else 4)
    return QuantizedActivation(q, s, M, group, x.dtype, xo)


def silu_and_mul_fp8(gate_up: torch.Tensor, group: int, write_x: bool = False, cfg: KernelConfig = DEFAULT
                     ) -> QuantizedActivation:
    """gate_up [M, 2n] (unit column stride; gate columns first) -> the e4m3 quantization, per row
    and `group` columns, of silu(gate) * up rounded to gate_up's dtype (silu_and_mul's output,
    which write_x also stores)."""
    M, n2 = gate_up.shape
    n = n2 // 2
    q, s, xo = _outputs(M, n, group, gate_up.device, gate_up.dtype, write_x)
    gp = triton.next_power_of_2(group)
    kg = triton.cdiv(n, group)
    bg = max(1, min(triton.next_power_of_2(kg), 4096 // gp))  # ~4k outputs a program
    _silu_quant_kernel[(q.shape[0], triton.cdiv(kg, bg))](
        gate_up, q, s, q if xo is None else xo, M, n, gate_up.stride(0), q.stride(0), s.stride(0), s.stride(1),
        0 if xo is None else xo.stride(0), GROUP=group, GP=gp, BG=bg, WRITE_X=write_x, FMAX=FP8_MAX,
        AMIN=MIN_AMAX, RECIP=_recip(gate_up, cfg), num_warps=4 if bg * gp <= 2048 else 8)
    return QuantizedActivation(q, s, M, group, gate_up.dtype, xo)
