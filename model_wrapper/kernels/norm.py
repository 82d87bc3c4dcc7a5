"""add_rms_norm: the residual add + RMSNorm before a projection, in place, one program a row, for
the steps of up to cfg.norm_max_tokens tokens (those whose projections run gemv or the skinny
GEMM next): with PDL the GEMM after it launches at once and reads its weights meanwhile, where
FlashInfer's fused_add_rmsnorm lets the next kernel launch only when it ends.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, uses_pdl
from model_wrapper.kernels.config import KernelConfig


@triton.jit
def add_rms_norm_row(x_row, r_row, out_row, w, cols, n, eps, store, FLAT: tl.constexpr):
    """One row's weight * RMSNorm(x + r) in x's dtype (fp32 statistics, the reference's roundings:
    the residual stream x + r rounded to the dtype first), with x + r stored to out_row where
    `store` (a scalar). cols: the row's column offsets, [BLOCK] (FLAT) or [chunks, CH] (the FP8
    GEMV's layout; the sum of squares then runs over both axes); w: the norm weight at cols.
    Shared by the standalone kernel below and the GEMVs' fused prologues (kernels/gemv.py,
    kernels/fp8_gemv.py): the same arithmetic in every one."""
    m = cols < n
    dtype = x_row.dtype.element_ty
    x = tl.load(x_row + cols, mask=m, other=0.0)
    r = tl.load(r_row + cols, mask=m, other=0.0)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the residual stream, rounded as in the reference
    tl.store(out_row + cols, s, mask=m & store)
    sf = s.to(tl.float32)
    if FLAT:
        ss = tl.sum(sf * sf, axis=0)
    else:
        ss = tl.sum(tl.sum(sf * sf, axis=1), axis=0)
    h = (sf * (1.0 / tl.sqrt(ss / n + eps))).to(dtype)
    return (w.to(tl.float32) * h.to(tl.float32)).to(dtype)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, n, stride_x, stride_r, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    r_row = r_ptr + row * stride_r
    # in place: this program alone reads and writes its row
    y = add_rms_norm_row(x_ptr + row * stride_x, r_row, r_row, w, cols, n, eps, True, True)
    tl.store(x_ptr + row * stride_x + cols, y, mask=m)


def add_rms_norm_fits(x: torch.Tensor, residual: torch.Tensor, cfg: KernelConfig = DEFAULT) -> bool:
    """Whether add_rms_norm takes the step: up to cfg.norm_max_tokens rows of at most cfg.gemv_max_k."""
    return (x.dim() == 2 and 0 < x.shape[0] <= cfg.norm_max_tokens and x.shape[1] <= cfg.gemv_max_k
            and x.stride(-1) == 1 and residual.stride(-1) == 1)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 cfg: KernelConfig = DEFAULT) -> None:
    """In place: residual <- residual + x, x <- weight * RMSNorm(residual) (fp32 statistics, the
    reference's roundings). One program a row; for the steps that run gemv or skinny_gemm next:
    they launch at once (the GEMV reads its weights while this runs; FlashInfer's norm lets the
    next kernel launch only when it ends). x, residual [T, n], unit column stride."""
    T, n = x.shape
    if T:
        pdl = uses_pdl(x.device, cfg)
        _add_rms_norm_kernel[(T,)](x, residual, weight, n, x.stride(0), residual.stride(0), eps,
                                   BLOCK=triton.next_power_of_2(n), PDL=pdl, num_warps=8, **launch_args(pdl))
