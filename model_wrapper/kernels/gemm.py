"""Tensor-core GEMMs of the CUDA path on Hopper (sm90), 16-bit floats, fp32 sums, one rounding.

skinny_gemm        x [M, K] @ W^T for steps of cfg.gemv_max_tokens + 1 .. cfg.skinny_max_tokens
                   tokens (decode at batch 3-64, short extends): W as the MMA's M side (BLOCK_N
                   rows a program), the tokens padded to 16 / 32 / 64 as its N side; K walked in
                   BLOCK_K steps through a STAGES-deep shared-memory pipeline; no split of K (each
                   output one program's sum: deterministic). Configs from a sweep on an H100
                   (benchmarks/ab_skinny.py); split-K lost to its reduction, an L2 prefetch of the
                   weights before the PDL wait slowed the chain.
wide_gate_up_silu  the MLP's gate_up projection with SiLU-and-mul in its epilogue for steps of
                   cfg.wide_min_tokens or more (prefill): a persistent TMA GEMM, no [M, 2n]
                   intermediate (benchmarks/ab_wide.py). W is read through a 3-D TMA view [2, n, K]
                   whose box [2, BLOCK_N, BLOCK_K] holds the gate rows and the up rows of one
                   column block: one [BM, 2 * BLOCK_N] product a tile, split in the epilogue. The
                   roundings are the unfused pair's: each product rounded to the dtype (with its
                   bias), then silu_and_mul's fp32 math, rounded once. A persistent grid (one
                   program per SM) walks the tiles in GROUP_M-row bands (L2 reuse of W). Plain
                   GEMMs (qkv, o, down) stay on cuBLAS, which this kernel did not beat there.
                   Under Triton's interpreter a program takes one tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import (DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, silu_mul, skinny_store,
                                          sm90, uses_pdl)
from model_wrapper.kernels.config import KernelConfig


def _skinny_config(BM: int, N: int, K: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, STAGES, warps) for BM padded tokens, N output columns, K inputs. The classes
    came from sweeps on an H100: Llama-3-8B's shapes (benchmarks/ab_skinny.py), then Qwen3-30B-A3B's
    attention and router shapes (session 42, benchmarks/results/session42: us a GEMM, 48 in a graph):
    few output rows against long ones want fewer rows a program (more programs) or a deeper pipeline."""
    if BM <= 16:
        if N < 96 * 64 and K > 8192:  # down: 256 programs
            return 16, 256, 6, 2
        if K >= 4096 and N <= 2048:  # Qwen3-30B-A3B's o [2048, 4096], 8 / 16 tokens: 9.56 / 8.60 us (was 11.15 / 11.13)
            return 32, 512, 4, 4
        if K >= 4096 and N <= 4096:  # Llama-3-8B's o: 13.49 / 13.74 (was 14.57 / 14.62)
            return 64, 256, 4, 4
        return 64, 256, 3, 4
    if N <= 2048:  # Qwen3-30B-A3B's o, 32 / 64 tokens: 8.63 / 11.05 us (was 10.48 / 13.48); router [128, 2048]:
        return 16, 512, 4 if BM <= 32 and K >= 4096 else 3, 4  # 3.93 / 5.49 (was 4.98 / 6.92)
    if N >= 96 * 128:  # gate_up, lm_head: >= 96 programs of 128 rows
        return 128, 128, 3, 8
    if N >= 96 * 64 or K <= 2048:  # qkv (Qwen3-30B-A3B's [5120, 2048], 32 / 64 tokens: 10.13 / 10.72, was 13.00 / 15.37)
        return 64, 256, 3, 4
    return (32, 512, 3, 4) if BM <= 32 else (32, 256, 4, 4)  # o, down: 128 programs of 32 rows


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, o_ptr, M, N, stride_x, stride_w, stride_o, K: tl.constexpr,
                   BM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SILU: tl.constexpr, PDL: tl.constexpr):
    # SILU as in _gemv_kernel: a program takes BLOCK_N // 2 gate rows and their BLOCK_N // 2 up rows
    ROWS: tl.constexpr = BLOCK_N // 2 if SILU else BLOCK_N
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < N
    w_rows = w_ptr + tl.where(live, rows, 0)[:, None].to(tl.int64) * stride_w
    toks = tl.arange(0, BM)
    tok_ok = toks < M
    ks = tl.arange(0, BLOCK_K)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    acc = tl.zeros([ROWS, BM], dtype=tl.float32)
    up = tl.zeros([ROWS, BM], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + ks
        k_ok = kk < K
        xt = tl.trans(tl.load(x_ptr + toks[:, None] * stride_x + kk[None, :], mask=tok_ok[:, None] & k_ok[None, :],
                              other=0.0))
        acc = tl.dot(tl.load(w_rows + kk[None, :], mask=k_ok[None, :], other=0.0), xt, acc)
        if SILU:
            up = tl.dot(tl.load(w_rows + N * stride_w + kk[None, :], mask=k_ok[None, :], other=0.0), xt, up)
    skinny_store(acc, up, b_ptr, o_ptr, rows, live, toks, tok_ok, N, stride_o, HAS_BIAS, SILU)

def skinny_fits(x: torch.Tensor, weight: torch.Tensor, cfg: KernelConfig = DEFAULT) -> bool:
    """Whether skinny_gemm takes x @ weight^T: cfg.gemv_max_tokens + 1 .. cfg.skinny_max_tokens rows
    of bf16 / fp16 on an sm90 GPU (the configs' shared memory and the sweep are Hopper's), unit
    column strides."""
    return (x.dim() == 2 and cfg.gemv_max_tokens < x.shape[0] <= cfg.skinny_max_tokens and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(-1) == 1 and weight.stride(-1) == 1
            and x.shape[1] == weight.shape[1] and sm90(x.device))


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                silu: bool = False, cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias [N]) -> [M, N] in x's dtype (fp32 sums, one rounding),
    M <= cfg.skinny_max_tokens; on the GPU for the shapes skinny_fits accepts (any device under
    Triton's interpreter). silu as in gemv."""
    M, K = x.shape
    N = weight.shape[0]
    bm = max(16, triton.next_power_of_2(M))
    block_n, block_k, stages, warps = _skinny_config(bm, N, K)  # with silu: the config of gate_up's shape
    if silu:
        block_n = max(block_n, 32)  # its halves (gate, up) are products of at least 16 rows
    n_out = N // 2 if silu else N
    out = torch.empty(M, n_out, dtype=x.dtype, device=x.device)
    pdl = uses_pdl(x.device, cfg)
    _skinny_kernel[(triton.cdiv(n_out, block_n // 2 if silu else block_n),)](
        x, weight, x if bias is None else bias, out, M, n_out, x.stride(0), weight.stride(0), out.stride(0), K=K,
        BM=bm, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, SILU=silu, PDL=pdl, num_warps=warps,
        num_stages=stages, **launch_args(pdl))
    return out


def _wide_config(M: int) -> tuple[int, int, int, int, int, int]:
    """(BM, BLOCK_N, BLOCK_K, STAGES, warps, GROUP_M); BLOCK_N output columns a tile."""
    return 128, 128, 64, 3, 8, 16 if M >= 4096 else 8


@triton.jit
def _wide_tile(a_desc, b_desc, c_desc, b_ptr, tile, M, N, K: tl.constexpr, BM: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr):
    # tile -> (row band, column block), GROUP_M row blocks a band
    band = GROUP_M * tl.cdiv(N, BLOCK_N)
    first = (tile // band) * GROUP_M
    rows = min(tl.cdiv(M, BM) - first, GROUP_M)
    om = (first + (tile % band) % rows) * BM
    on = (tile % band) // rows * BLOCK_N
    acc = tl.zeros((BM, 2 * BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        w = b_desc.load([0, on, k]).reshape(2 * BLOCK_N, BLOCK_K)  # gate rows, then up rows
        acc = tl.dot(a_desc.load([om, k]), w.T, acc)
    g, u = acc.reshape(BM, 2, BLOCK_N).permute(0, 2, 1).split()
    if HAS_BIAS:
        cols = on + tl.arange(0, BLOCK_N)
        g += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        u += tl.load(b_ptr + N + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    dtype = c_desc.dtype
    c_desc.store([om, on], silu_mul(g.to(dtype), u.to(dtype)).to(dtype))


@triton.jit
def _wide_kernel(a_desc, b_desc, c_desc, b_ptr, M, N, programs, K: tl.constexpr, BM: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
                 PERSISTENT: tl.constexpr):
    if PERSISTENT:
        tiles = tl.cdiv(M, BM) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), tiles, programs, flatten=True):
            _wide_tile(a_desc, b_desc, c_desc, b_ptr, tile, M, N, K, BM, BLOCK_N, BLOCK_K, GROUP_M, HAS_BIAS)
    else:
        _wide_tile(a_desc, b_desc, c_desc, b_ptr, tl.program_id(0), M, N, K, BM, BLOCK_N, BLOCK_K, GROUP_M, HAS_BIAS)


def _tma_ok(t: torch.Tensor) -> bool:
    """A TMA descriptor's needs: unit last stride, 16-byte aligned base and row stride."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def wide_silu_fits(x: torch.Tensor, weight: torch.Tensor, cfg: KernelConfig = DEFAULT) -> bool:
    """Whether wide_gate_up_silu takes x and gate_up weight [2n, K]: at least cfg.wide_min_tokens rows
    of bf16 / fp16 on an sm90 GPU, operands that TMA can address (weight contiguous, K and n multiples of 8)."""
    return (x.dim() == 2 and x.shape[0] >= cfg.wide_min_tokens and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and x.shape[1] == weight.shape[1]
            and x.shape[1] % 8 == 0 and weight.shape[0] % 16 == 0 and weight.is_contiguous()
            and _tma_ok(x) and _tma_ok(weight) and sm90(x.device))


def wide_gate_up_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K], gate_up weight [2n, K] (gate rows first, bias [2n]) -> silu_and_mul(x @ weight^T + bias)
    [M, n] in x's dtype, for the shapes wide_silu_fits accepts (any, under Triton's interpreter)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = x.shape
    n = weight.shape[0] // 2
    bm, block_n, block_k, stages, warps, group = _wide_config(M)
    out = torch.empty(M, n, dtype=x.dtype, device=x.device)
    if not M:
        return out
    a = TensorDescriptor.from_tensor(x, [bm, block_k])
    b = TensorDescriptor(weight, [2, n, K], [n * K, K, 1], [2, block_n, block_k])
    c = TensorDescriptor.from_tensor(out, [bm, block_n])
    tiles = triton.cdiv(M, bm) * triton.cdiv(n, block_n)
    persistent = x.device.type == "cuda"
    programs = min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count) if persistent else tiles
    _wide_kernel[(programs,)](a, b, c, x if bias is None else bias, M, n, programs, K=K, BM=bm, BLOCK_N=block_n,
                              BLOCK_K=block_k, GROUP_M=group, HAS_BIAS=bias is not None, PERSISTENT=persistent,
                              num_warps=warps, num_stages=stages)
    return out
