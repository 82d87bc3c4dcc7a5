"""The quantize kernels' division through the scale's reciprocal (kernels/fp8_act.div_by_scale, RECIP: on a GPU,
KernelConfig.fp8_quant_reciprocal) gives IEEE fp32's quotient bit for bit: the kernel's sequence

    r = RN(1 / s);  q0 = RN(y * r);  q = RN(q0 + RN_exact(y - s * q0) * r)  (two fused multiply-adds);  q0 where q0 == 0

is evaluated here in exact rational arithmetic with one rounding to fp32 per operation (what an fma does), and
compared with torch's fp32 division (the reference quantizer's, quantize_fp8_reference) over quotients the
quantizers meet (|y| <= amax, s = max(amax, MIN_AMAX) / 448: |y / s| <= 448), scales over the whole exponent range,
divisors with all-ones and all-zeros significands, zeros of both signs and quotients that underflow. The CUDA tests
of test_fp8_act.py check the kernels themselves against quantize_fp8_reference on a GPU.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from model_wrapper.kernels.fp8_reference import FP8_MAX, MIN_AMAX


def rn32(x: Fraction) -> float:
    """The fp32 value nearest x (ties to even), subnormals included; as a Python float (exact)."""
    if x == 0:
        return 0.0
    sign, a = (-1.0, -x) if x < 0 else (1.0, x)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    while Fraction(2) ** e > a:  # the log2 estimate may be one off
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    m = round(a / quantum)  # Fraction.__round__: ties to even
    return sign * float(m * quantum)


def div_by_scale(y: float, s: float) -> float:
    """The kernel's RECIP sequence, each operation rounded once to fp32 (an fma: the exact product-sum, rounded)."""
    r = rn32(1 / Fraction(s))
    q0 = rn32(Fraction(y) * Fraction(r))
    if q0 == 0.0:
        return math.copysign(0.0, y) if y == 0.0 else q0  # kept: q0 has y's sign
    rem = rn32(Fraction(y) - Fraction(s) * Fraction(q0))
    return rn32(Fraction(q0) + Fraction(rem) * Fraction(r))


def torch_div(y: list[float], s: list[float]) -> list[float]:
    return (torch.tensor(y, dtype=torch.float32) / torch.tensor(s, dtype=torch.float32)).tolist()


def _cases(n: int) -> tuple[list[float], list[float]]:
    g = torch.Generator().manual_seed(58)
    amax = (torch.rand(n, generator=g) * 2 - 1).mul(40).exp2().float()  # 2^-40 .. 2^40
    s = (amax.clamp_min(MIN_AMAX) / FP8_MAX).float()
    frac = torch.rand(n, generator=g) * 2 - 1
    frac[: n // 8] = frac[: n // 8].sign()  # y = +-amax: quotients at 448
    y = (frac * amax).to(torch.bfloat16).float()  # the activations are 16-bit values
    y = torch.where(y.abs() > amax, amax * y.sign(), y)
    return y.tolist(), s.tolist()


def test_reciprocal_division_is_ieee_division_on_the_quantizers_quotients():
    y, s = _cases(4000)
    got = [div_by_scale(a, b) for a, b in zip(y, s)]
    want = torch_div(y, s)
    bad = [(a, b, g, w) for a, b, g, w in zip(y, s, got, want) if g != w or math.copysign(1, g) != math.copysign(1, w)]
    assert not bad, bad[:5]


def test_reciprocal_division_at_edge_divisors_and_signed_zeros():
    one_less = float(torch.tensor(2.0).float().nextafter(torch.tensor(0.0)))  # 2 - 2^-23: all-ones significand
    divisors = [1.0, one_less, 0.75, 3.0, 1.5 * 2.0**-20, MIN_AMAX / FP8_MAX, 2.0**100 * one_less, 7.0 / 448]
    g = torch.Generator().manual_seed(7)
    ys, ss = [], []
    for s in divisors:
        s = float(torch.tensor(s, dtype=torch.float32))
        amax = s * FP8_MAX
        picks = (torch.rand(300, generator=g) * 2 - 1) * amax
        vals = picks.to(torch.bfloat16).float().clamp(-amax, amax).tolist()
        vals += [0.0, -0.0, amax, -amax, s, -s, s * 2.0**-30, -s * 2.0**-60]  # zeros, the ends, underflowing quotients
        ys += vals
        ss += [s] * len(vals)
    ys = [float(torch.tensor(v, dtype=torch.float32)) for v in ys]
    want = torch_div(ys, ss)
    for a, b, w in zip(ys, ss, want):
        got = div_by_scale(a, b)
        assert got == w and math.copysign(1, got) == math.copysign(1, w), (a, b, got, w)
