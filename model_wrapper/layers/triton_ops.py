"""Two small Triton kernels for the CUDA path (imported only when Triton is there):

silu_and_mul  [T, 2N] -> [T, N]: silu(gate) * up in one pass (fp32 math, one rounding), instead
              of torch's silu, then mul (three passes over the activations).
store_kv      writes this step's K and V rows [T, kv_heads * head_dim] at flat slots of the
              caller's caches in one launch; rows whose slot is -1 write nothing. Graph-safe: a
              padded decode batch simply carries -1 slots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    g = tl.load(x_ptr + row * stride_x + col, mask=m).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + n + col, mask=m).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + col, y.to(out_ptr.dtype.element_ty), mask=m)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2N] (rows contiguous) -> [T, N]."""
    T, n2 = x.shape
    n = n2 // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    if T:
        block = 1024
        _silu_and_mul_kernel[(T, triton.cdiv(n, block))](x, out, n, x.stride(0), out.stride(0), BLOCK=block)
    return out


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_k, stride_v, width,
                     BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = (offs < width) & (slot >= 0)
    k = tl.load(k_ptr + t * stride_k + offs, mask=m)
    v = tl.load(v_ptr + t * stride_v + offs, mask=m)
    tl.store(kc_ptr + slot * width + offs, k, mask=m)
    tl.store(vc_ptr + slot * width + offs, v, mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    """k, v [T, kv_heads, head_dim] (each row contiguous); caches [blocks, block_size, kv_heads,
    head_dim] contiguous; slots [T] int64, -1 = skip."""
    T = k.shape[0]
    width = k.shape[1] * k.shape[2]
    if T:
        _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slots, k.stride(0), v.stride(0), width,
                               BLOCK=triton.next_power_of_2(width))
