"""Small Triton kernels for the CUDA path (imported only when Triton is there), among them:

silu_and_mul  [T, 2N] -> [T, N]: silu(gate) * up in one pass (fp32 math, one rounding), instead
              of torch's silu, then mul (three passes over the activations).
gemv          x [T, K] @ W^T (+ b) for steps of one or two tokens: each program holds whole rows of W
              and reads them before it waits for the kernel that wrote x.
skinny_gemm   the same for steps of 3-64 tokens on Hopper, on tensor cores (W as the MMA's M side);
              add_rms_norm, the residual add + RMSNorm before them, lets them launch at once.
wide_gate_up_silu  the MLP's gate_up projection with SiLU-and-mul in its epilogue for steps of
              1024+ tokens on Hopper (prefill): a persistent TMA GEMM, no [T, 2n] intermediate.
store_kv      writes this step's K and V rows [T, kv_heads * head_dim] at flat slots of the
              caller's caches in one launch; rows whose slot is -1 write nothing. Graph-safe: a
              padded decode batch simply carries -1 slots.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Programmatic dependent launch (Hopper and later, not under the interpreter): silu_and_mul and
# RoPE + K/V store are launched while the GEMM before them drains and wait (gdc_wait) before
# reading its output. Measured on an H100 (Llama-3-8B, batch 32 @ 2k, graph replay): 9.33 ->
# 9.17 ms a step. Not for their LoRA-fused variants: there it measured no gain (10.22 vs 10.23 ms
# with 1 adapter), with or without their B tiles read before the wait. These kernels and gemv
# also let the next kernel launch at once (gdc_launch_dependents on entry): it may then only read,
# before its own wait, what no kernel of the step writes (gemv: its weights).
PDL = True


@functools.lru_cache(maxsize=None)
def _pdl(device: torch.device) -> bool:
    return PDL and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _launch(pdl: bool) -> dict:
    return dict(launch_pdl=True) if pdl else {}


@triton.jit
def _silu_mul(g, u):
    """silu(g) * u in fp32 (g, u of any float dtype)."""
    g = g.to(tl.float32)
    return g / (1.0 + tl.exp(-g)) * u.to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n, stride_x, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the GEMM that wrote x is complete
    g = tl.load(x_ptr + row * stride_x + col, mask=m)
    u = tl.load(x_ptr + row * stride_x + n + col, mask=m)
    tl.store(out_ptr + row * stride_o + col, _silu_mul(g, u).to(out_ptr.dtype.element_ty), mask=m)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2N] (rows contiguous) -> [T, N]."""
    T, n2 = x.shape
    n = n2 // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    if T:
        block = 1024
        pdl = _pdl(x.device)
        _silu_and_mul_kernel[(T, triton.cdiv(n, block))](x, out, n, x.stride(0), out.stride(0), BLOCK=block, PDL=pdl,
                                                         **_launch(pdl))
    return out


# GEMV for steps of up to GEMV_MAX_TOKENS tokens (decode at batch 1 and 2, or one request's two
# speculative tokens). A program holds GEMV_TILE weights (BLOCK_N whole rows) in registers: it
# loads them first, then waits for the kernel that wrote x (PDL), so the weights of the next
# projection stream in while the one before drains. Measured on an H100 (Llama-3-8B shapes,
# benchmarks/ab_gemv.py, results/gemv.json):
# - the model's projections alone (32 layers + lm_head, 15.0 GB) in one graph: 5.02 ms (2.99 TB/s;
#   copy 3.00) at 1 token, 5.29 at 2, 6.91 at 4 (fp32 FMAs, no tensor cores), cuBLAS 5.63-5.65;
#   in a scratch sweep, tiles of 8k / 32k weights or 4 warps within 0.1 ms, without PDL +0.24 ms;
# - the decode step (wall clock, ctx 512-4096): batch 1 6.30-6.54 -> 5.54-5.75 ms with
#   add_rms_norm (5.64-5.86 with FlashInfer's norm), batch 2 6.40-6.76 -> 5.87-6.22 ms.
GEMV_MAX_TOKENS = 2
GEMV_TILE = 16384
GEMV_WARPS = 8
GEMV_MAX_K = 32768  # a program holds at most this many weights (one row): wider rows go to cuBLAS


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, N, stride_x, stride_w, stride_o, K: tl.constexpr, KP: tl.constexpr,
                 M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                 PDL: tl.constexpr):
    # SILU: W is gate_up [2N, K]; output column n is silu(x @ W[n]) * (x @ W[N + n]), each product
    # rounded to the output dtype first (as the unfused GEMM, then silu_and_mul)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, KP)
    live = rows < N
    wm = live[:, None] & (cols < K)[None, :]
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
    w = tl.load(w_rows, mask=wm, other=0.0)
    if SILU:
        wu = tl.load(w_rows + N * stride_w, mask=wm, other=0.0)
    if HAS_BIAS:
        b = tl.load(b_ptr + rows, mask=live, other=0.0).to(tl.float32)
        if SILU:
            bu = tl.load(b_ptr + N + rows, mask=live, other=0.0).to(tl.float32)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        x = tl.load(x_ptr + m * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if HAS_BIAS:
            acc += b
        if SILU:
            up = tl.sum(wu.to(tl.float32) * x[None, :], axis=1)
            if HAS_BIAS:
                up += bu
            acc = _silu_mul(acc.to(dtype), up.to(dtype))
        tl.store(o_ptr + m * stride_o + rows, acc.to(dtype), mask=live)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, n, stride_x, stride_r, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    r = tl.load(r_ptr + row * stride_r + cols, mask=m, other=0.0)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the residual stream, rounded as in the reference
    tl.store(r_ptr + row * stride_r + cols, s, mask=m)
    sf = s.to(tl.float32)
    h = (sf * (1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n + eps))).to(dtype)
    tl.store(x_ptr + row * stride_x + cols, (w.to(tl.float32) * h.to(tl.float32)).to(dtype), mask=m)


# add_rms_norm takes steps of up to this many tokens (one program a row), those whose projections
# run gemv or skinny_gemm next: it lets them launch at once, FlashInfer's norm only when it ends.
# benchmarks/ab_skinny.py (graph replay, H100): with the skinny GEMM, batch 8 @ 512 6.12-6.13 ->
# 6.04-6.05 ms, batch 32 @ 512 6.80-6.82 -> 6.70-6.73 ms.
NORM_MAX_TOKENS = 64


def add_rms_norm_fits(x: torch.Tensor, residual: torch.Tensor) -> bool:
    """Whether add_rms_norm takes the step: up to NORM_MAX_TOKENS rows of at most GEMV_MAX_K."""
    return (x.dim() == 2 and 0 < x.shape[0] <= NORM_MAX_TOKENS and x.shape[1] <= GEMV_MAX_K
            and x.stride(-1) == 1 and residual.stride(-1) == 1)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual <- residual + x, x <- weight * RMSNorm(residual) (fp32 statistics, the
    reference's roundings). One program a row; for the steps that run gemv or skinny_gemm next:
    they launch at once (the GEMV reads its weights while this runs; FlashInfer's norm lets the
    next kernel launch only when it ends). x, residual [T, n], unit column stride."""
    T, n = x.shape
    if T:
        pdl = _pdl(x.device)
        _add_rms_norm_kernel[(T,)](x, residual, weight, n, x.stride(0), residual.stride(0), eps,
                                   BLOCK=triton.next_power_of_2(n), PDL=pdl, num_warps=8, **_launch(pdl))


def gemv_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gemv takes x @ weight^T: 1..GEMV_MAX_TOKENS rows of a 16- or 32-bit float, unit
    column strides, rows of at most GEMV_MAX_K."""
    return (x.dim() == 2 and 0 < x.shape[0] <= GEMV_MAX_TOKENS and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.stride(-1) == 1
            and weight.stride(-1) == 1 and x.shape[1] == weight.shape[1] <= GEMV_MAX_K)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, silu: bool = False) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T (+ bias [N]) -> [T, N] in x's dtype (fp32 sums, one rounding);
    for the shapes gemv_fits accepts. silu: weight is gate_up [2n, K] (bias [2n]) and the result
    is silu_and_mul of that product, [T, n], without the [T, 2n] intermediate."""
    T, K = x.shape
    N = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(T, N, dtype=x.dtype, device=x.device)
    kp = triton.next_power_of_2(K)
    block_n = max(1, GEMV_TILE // kp // (2 if silu else 1))  # weights a program holds: GEMV_TILE
    pdl = _pdl(x.device)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, x if bias is None else bias, out, N, x.stride(0), weight.stride(0), out.stride(0), K=K, KP=kp, M=T,
        BLOCK_N=block_n, HAS_BIAS=bias is not None, SILU=silu, PDL=pdl, num_warps=GEMV_WARPS, **_launch(pdl))
    return out


# Skinny GEMM for steps of GEMV_MAX_TOKENS + 1 .. SKINNY_MAX_TOKENS tokens (decode at batch 3-64,
# short extends), on sm90 in 16-bit floats: x [M, K] @ W^T with W as the MMA's M side (BLOCK_N
# rows a program) and the tokens, padded to 16 / 32 / 64, as its N side; K is walked in BLOCK_K
# steps through a software pipeline of STAGES shared-memory buffers; fp32 sums, one rounding,
# no split of K (every output is one program's sum: deterministic). The configs come from a sweep
# on an H100; benchmarks/ab_skinny.py (results/skinny.json) times 32 GEMMs of one Llama-3-8B shape
# back to back in a graph against cuBLAS: at 32 tokens qkv 21.7 -> 19.8 us, o 14.6 -> 14.3,
# gate_up 84.3 -> 81.1, down 45.9 -> 42.9, lm_head 385 -> 352; at 4-16 tokens o 16.3-16.6 ->
# 14.4-14.5; at 64 qkv and o even. In the scratch sweep, split-K variants (the last program of a
# tile summing the partials in order) lost 3-15 us a GEMM to the reduction, and an L2 prefetch of
# each program's weights before the PDL wait slowed the projections' chain from 6.0 to 7.6 ms.
SKINNY_MAX_TOKENS = 64


def _skinny_config(BM: int, N: int, K: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, STAGES, warps) for BM padded tokens, N output columns, K inputs."""
    if BM <= 16:
        return (16, 256, 6, 2) if N < 96 * 64 and K > 8192 else (64, 256, 3, 4)  # down: 256 programs
    if N >= 96 * 128:  # gate_up, lm_head: >= 96 programs of 128 rows
        return 128, 128, 3, 8
    if N >= 96 * 64:  # qkv
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
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=live, other=0.0).to(tl.float32)[:, None]
        if SILU:
            up += tl.load(b_ptr + N + rows, mask=live, other=0.0).to(tl.float32)[:, None]
    dtype = o_ptr.dtype.element_ty
    if SILU:
        acc = _silu_mul(acc.to(dtype), up.to(dtype))
    tl.store(o_ptr + toks[None, :] * stride_o + rows[:, None], acc.to(dtype), mask=live[:, None] & tok_ok[None, :])


@functools.cache
def _sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def skinny_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether skinny_gemm takes x @ weight^T: GEMV_MAX_TOKENS + 1 .. SKINNY_MAX_TOKENS rows of
    bf16 / fp16 on an sm90 GPU (the configs' shared memory and the sweep are Hopper's), unit
    column strides."""
    return (x.dim() == 2 and GEMV_MAX_TOKENS < x.shape[0] <= SKINNY_MAX_TOKENS and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(-1) == 1 and weight.stride(-1) == 1
            and x.shape[1] == weight.shape[1] and _sm90(x.device))


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                silu: bool = False) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias [N]) -> [M, N] in x's dtype (fp32 sums, one rounding),
    M <= SKINNY_MAX_TOKENS; on the GPU for the shapes skinny_fits accepts (any device under
    Triton's interpreter). silu as in gemv."""
    M, K = x.shape
    N = weight.shape[0]
    bm = max(16, triton.next_power_of_2(M))
    block_n, block_k, stages, warps = _skinny_config(bm, N, K)  # with silu: the config of gate_up's shape
    if silu:
        block_n = max(block_n, 32)  # its halves (gate, up) are products of at least 16 rows
    n_out = N // 2 if silu else N
    out = torch.empty(M, n_out, dtype=x.dtype, device=x.device)
    pdl = _pdl(x.device)
    _skinny_kernel[(triton.cdiv(n_out, block_n // 2 if silu else block_n),)](
        x, weight, x if bias is None else bias, out, M, n_out, x.stride(0), weight.stride(0), out.stride(0), K=K,
        BM=bm, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, SILU=silu, PDL=pdl, num_warps=warps,
        num_stages=stages, **_launch(pdl))
    return out


# gate_up + SiLU-and-mul as one GEMM for steps of WIDE_MIN_TOKENS or more (prefill, long
# extends) on sm90 in 16-bit floats: x [M, K] @ gate_up[2n, K]^T -> silu(gate) * up [M, n], without
# the [M, 2n] intermediate and the silu_and_mul pass over it. W is read through a 3-D TMA view
# [2, n, K] whose box [2, BLOCK_N, BLOCK_K] holds the gate rows and the up rows of one column
# block: one [BM, 2 * BLOCK_N] product a tile (one wide MMA), split in the epilogue. The roundings
# are the unfused pair's: each product rounded to the dtype (with its bias), then silu_and_mul's
# fp32 math, rounded once. A persistent grid (one program per SM) walks the tiles in GROUP_M-row
# bands (L2 reuse of W); TMA loads feed a STAGES-deep pipeline. benchmarks/ab_wide.py (H100,
# Llama-3-8B gate_up, results/wide.json): against cuBLAS's GEMM + silu_and_mul, 1024 tokens 321
# vs 338 us, 2048 645 vs 687, 4096 1258 vs 1550 (cuBLAS's GEMM alone 1256), 8192 2722 vs 2893; at
# 512 it loses (192 vs 182), hence from 1024. Scratch variants: a pair of [BM, BLOCK_N] products
# a tile (two TMA loads of W, two narrower MMAs) reached only 598 TFLOP/s; plain GEMMs (qkv, o,
# down) stay on cuBLAS: this kernel without an epilogue measured up to 4 % slower there, with a
# residual-add epilogue (o, down) 13-29 % slower, with a RoPE + K/V-store epilogue (qkv) no faster
# than cuBLAS + the two kernels (its shuffles of the tile take a pipeline stage's shared memory).
# Under Triton's interpreter a program takes one tile (its range over program ids is not interpreted).
WIDE_MIN_TOKENS = 1024


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
    c_desc.store([om, on], _silu_mul(g.to(dtype), u.to(dtype)).to(dtype))


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


def wide_silu_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether wide_gate_up_silu takes x and gate_up weight [2n, K]: at least WIDE_MIN_TOKENS rows of
    bf16 / fp16 on an sm90 GPU, operands that TMA can address (weight contiguous, K and n multiples of 8)."""
    return (x.dim() == 2 and x.shape[0] >= WIDE_MIN_TOKENS and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and x.shape[1] == weight.shape[1]
            and x.shape[1] % 8 == 0 and weight.shape[0] % 16 == 0 and weight.is_contiguous()
            and _tma_ok(x) and _tma_ok(weight) and _sm90(x.device))


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


# -- fused kernels with an optional LoRA delta ------------------------------------------------------
#
# A projection's LoRA delta can be added by the kernel that consumes the projection's output,
# instead of by an expand kernel of its own (one launch and one pass over y fewer per projection):
# LoraBatch.finish_deferred hands over a LoraDelta (adapters.lora_batch) with the shrink's fp32
# partial sums s [splits, T, n_sub * R], the B stacks [slots, out_i, R], the per-token slots and
# true ranks (or, from a folded GEMM, s [1, T, slots * slot_stride] with every slot's shrink, token
# t's own at column slot * slot_stride: read at + slot * slot_stride below, 0 otherwise).
# For token t with slot >= 0, sub-module i, column n:
#     y[t, n] <- round(y[t, n] + sum_r round(sum_p s[p, t, i*R + r]) * B_i[slot, n, r])
# (the same roundings as the expand kernel: s summed in fp32 and rounded to the weights' dtype,
# products accumulated in fp32, one rounding of y). Rows with slot -1 (base model, padding) and
# the columns r >= the true rank of s are never read; B tiles are read whole (_b_mask).
#
# How these kernels are written for latency (H100, 16 x rank 16, batch 32 decode graph: SiLU-and-mul
# 13.7 -> 12.3 us a call, the residual add + RMSNorm 5.4 -> 4.9, RoPE + store 6.0 -> 5.0):
# - B tiles masked only along n (not by the rank), so that they are read in 16-byte vectors;
# - a program reads every row it needs before it writes any (a store holds later loads back: the
#   compiler cannot move a load above a store that may alias it), and without a branch or a loop
#   around the LoRA loads (the splits of s unrolled: NUM_SPLITS; no delta = rank 0, masked);
# - a slot-major program of a slot no token uses returns at once.


@triton.jit
def _b_mask(n_ok, rank, r, R, RPAD: tl.constexpr):
    """Where a B tile is read: its columns n_ok of a slot with a delta (rank > 0), every r < R.
    Not masked by the rank: B is zero past each adapter's rank (LoraManager._write_slot zeroes a
    slot before writing it; s is masked by the rank, so that a product there is 0 * 0), and a mask
    constant along r lets the tile be read in 16-byte vectors instead of element by element.
    RPAD: the tile is wider than the stack (BLOCK_R > R)."""
    ok = n_ok & (rank > 0)
    if RPAD:
        ok = ok & (r < R)
    return ok


@triton.jit
def _lora_s(s_ptr, rank, slot, t, sub, R, stride_sp, stride_sm, stride_ss, dtype, BLOCK_R: tl.constexpr,
            NUM_SPLITS: tl.constexpr, scale):
    """Token t's shrink output for sub-module `sub` of `slot`: the partials summed, times `scale`
    (the token's deferred RMSNorm factor, see _row_scale) and rounded to the weights' dtype, as
    fp32 [BLOCK_R], zero at r >= rank (the true rank; 0 where the token has no delta: nothing
    read). Straight-line loads (the splits unrolled), so that a caller's loads of several rows
    are all in flight at once."""
    r = tl.arange(0, BLOCK_R)
    at = s_ptr + t * stride_sm + tl.maximum(slot, 0) * stride_ss + sub * R + r
    sv = tl.zeros([BLOCK_R], dtype=tl.float32)
    for p in tl.static_range(NUM_SPLITS):
        sv += tl.load(at + p * stride_sp, mask=r < rank, other=0.0).to(tl.float32)
    return (sv * scale).to(dtype).to(tl.float32)


@triton.jit
def _row_scale(ss_ptr, t, nb, inv_n, eps, NB: tl.constexpr):
    """Row t's RMSNorm factor rsqrt(mean(v^2) + eps), from the nb sums of squares per column block
    that add_lora_rms_norm left at ss[t, :nb] (fp32)."""
    j = tl.arange(0, NB)
    ss = tl.sum(tl.load(ss_ptr + t * nb + j, mask=j < nb, other=0.0), axis=0)
    return 1.0 / tl.sqrt(ss * inv_n + eps)


@triton.jit
def _rows_scale(ss_ptr, t, nb, inv_n, eps, NB: tl.constexpr):
    """_row_scale of the rows t [BLOCK_T] -> [BLOCK_T]."""
    j = tl.arange(0, NB)
    ss = tl.sum(tl.load(ss_ptr + t[:, None] * nb + j[None, :], mask=(j < nb)[None, :], other=0.0), axis=1)
    return 1.0 / tl.sqrt(ss * inv_n + eps)


@triton.jit
def _lora_b(b_ptr, rank, slot, n, n_ok, n_out, R, BLOCK_R: tl.constexpr, RPAD: tl.constexpr):
    """B[slot, n, :] as a [len(n), BLOCK_R] tile (rank 0, no delta: zero, nothing read). Read
    whole rows: B is zero past each adapter's rank (see _b_mask)."""
    r = tl.arange(0, BLOCK_R)
    return tl.load(b_ptr + tl.maximum(slot, 0).to(tl.int64) * n_out * R + n[:, None] * R + r[None, :],
                   mask=_b_mask(n_ok[:, None], rank, r[None, :], R, RPAD), other=0.0)


@triton.jit
def _lora_add(x, bv, s_ptr, rank, slot, t, sub, R, stride_sp, stride_sm, stride_ss, BLOCK_R: tl.constexpr,
              NUM_SPLITS: tl.constexpr, scale):
    """x [len(n)] + token t's delta (bv: its _lora_b tile), one rounding to x's dtype; x itself
    where rank is 0 (no delta)."""
    sv = _lora_s(s_ptr, rank, slot, t, sub, R, stride_sp, stride_sm, stride_ss, bv.dtype, BLOCK_R, NUM_SPLITS, scale)
    return tl.where(rank > 0, (x.to(tl.float32) + tl.sum(bv.to(tl.float32) * sv[None, :], axis=1)).to(x.dtype), x)


@triton.jit
def _token_group(groups_ptr, stride_g, S):
    """A slot-major program's group g (axis 0): -> (whether g < S is an adapter slot, the slot
    clamped to a valid index (int64), a pointer to groups[g] = [count, row, row, ...], count)."""
    grp = tl.program_id(0)
    row0 = groups_ptr + grp * stride_g
    return grp < S, tl.minimum(grp, S - 1).to(tl.int64), row0, tl.load(row0)


@triton.jit
def _silu_lora_row(x_ptr, s_ptr, ss_ptr, bgf, buf, rank_g, rank_u, s0, t, col, m, n, R, stride_x, stride_sp,
                   stride_sm, stride_ss, nb, inv_n, eps, BLOCK_R: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   SCALED: tl.constexpr, NB: tl.constexpr):
    """silu(gate) * up (fp32) of token t's columns `col` of x [T, 2N]: scaled by its RMSNorm factor
    (SCALED) and with its gate_up delta added (bgf / buf its slot's B^T tiles in fp32; ranks 0: no
    delta). Loads only, no branch: a caller's two rows are read at once."""
    g = tl.load(x_ptr + t * stride_x + col, mask=m, other=0.0)
    u = tl.load(x_ptr + t * stride_x + n + col, mask=m, other=0.0)
    rs = 1.0
    if SCALED:
        rs = _row_scale(ss_ptr, t, nb, inv_n, eps, NB)
        g = (g.to(tl.float32) * rs).to(g.dtype)
        u = (u.to(tl.float32) * rs).to(u.dtype)
    dt = g.dtype
    sg = _lora_s(s_ptr, rank_g, s0, t, 0, R, stride_sp, stride_sm, stride_ss, dt, BLOCK_R, NUM_SPLITS, rs)
    su = _lora_s(s_ptr, rank_u, s0, t, 1, R, stride_sp, stride_sm, stride_ss, dt, BLOCK_R, NUM_SPLITS, rs)
    g = tl.where(rank_g > 0, (g.to(tl.float32) + tl.sum(bgf * sg[:, None], axis=0)).to(dt), g)
    u = tl.where(rank_u > 0, (u.to(tl.float32) + tl.sum(buf * su[:, None], axis=0)).to(dt), u)
    return _silu_mul(g, u)


@triton.jit
def _silu_and_mul_lora_kernel(x_ptr, out_ptr, s_ptr, bg_ptr, bu_ptr, rank_ptr, groups_ptr, ss_ptr, n, R, S,
                              stride_x, stride_o, stride_sp, stride_sm, stride_ss, stride_g, nb, inv_n, eps,
                              BLOCK_T: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, RPAD: tl.constexpr,
                              NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, SCALED: tl.constexpr,
                              NB: tl.constexpr):
    """Program (group, column block). Group g < S: the tokens of adapter slot g; g = S: the tokens
    without one (groups[g] = [count, row, row, ...], adapters.lora_groups). Each adapter's B tile is
    read once per step however many tokens use it, and not at all by a slot no token uses. SCALED:
    x and s are the projections of an unnormalised input (add_lora_rms_norm); each token's rows are
    first multiplied by its RMSNorm factor (_row_scale) and rounded, as the GEMM's output would be."""
    lora, s0, row0, count = _token_group(groups_ptr, stride_g, S)
    if count == 0:  # (a slot no token of this step uses)
        return
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    r = tl.arange(0, BLOCK_R)
    rank_g = tl.where(lora, tl.load(rank_ptr + s0 * 2), 0)
    rank_u = tl.where(lora, tl.load(rank_ptr + s0 * 2 + 1), 0)
    b_at = s0 * n * R + col[None, :] * R + r[:, None]  # [BLOCK_R, BLOCK] tile of B^T
    bg = tl.load(bg_ptr + b_at, mask=_b_mask(m[None, :], rank_g, r[:, None], R, RPAD), other=0.0)
    bu = tl.load(bu_ptr + b_at, mask=_b_mask(m[None, :], rank_u, r[:, None], R, RPAD), other=0.0)
    if count <= 2:  # one or two tokens (the common case with many adapters): CUDA-core products; both
        # rows are read before either is written (a store would hold the second row's loads back); with
        # one token the second is row 0, read and never written
        bgf = bg.to(tl.float32)
        buf = bu.to(tl.float32)
        t0 = tl.load(row0 + 1).to(tl.int64)
        t1 = tl.load(row0 + 2, mask=count > 1, other=0).to(tl.int64)
        y0 = _silu_lora_row(x_ptr, s_ptr, ss_ptr, bgf, buf, rank_g, rank_u, s0, t0, col, m, n, R, stride_x,
                            stride_sp, stride_sm, stride_ss, nb, inv_n, eps, BLOCK_R, NUM_SPLITS, SCALED, NB)
        y1 = _silu_lora_row(x_ptr, s_ptr, ss_ptr, bgf, buf, rank_g, rank_u, s0, t1, col, m, n, R, stride_x,
                            stride_sp, stride_sm, stride_ss, nb, inv_n, eps, BLOCK_R, NUM_SPLITS, SCALED, NB)
        tl.store(out_ptr + t0 * stride_o + col, y0.to(out_ptr.dtype.element_ty), mask=m)
        tl.store(out_ptr + t1 * stride_o + col, y1.to(out_ptr.dtype.element_ty), mask=m & (count > 1))
    else:  # BLOCK_T tokens at a time through tensor-core products
        for c0 in range(0, count, BLOCK_T):
            i = c0 + tl.arange(0, BLOCK_T)
            ok = i < count
            t = tl.load(row0 + 1 + i, mask=ok, other=0).to(tl.int64)
            xm = ok[:, None] & m[None, :]
            g = tl.load(x_ptr + t[:, None] * stride_x + col[None, :], mask=xm, other=0.0)
            u = tl.load(x_ptr + t[:, None] * stride_x + n + col[None, :], mask=xm, other=0.0)
            rs = tl.full([BLOCK_T], 1.0, tl.float32)
            if SCALED:
                rs = _rows_scale(ss_ptr, t, nb, inv_n, eps, NB)
                g = (g.to(tl.float32) * rs[:, None]).to(g.dtype)
                u = (u.to(tl.float32) * rs[:, None]).to(u.dtype)
            # the shrink rows summed over the splits and rounded to the weights' dtype, then @ B^T
            sg = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            su = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for p in tl.static_range(NUM_SPLITS):
                sp = s_ptr + p * stride_sp + t[:, None] * stride_sm + s0 * stride_ss + r[None, :]
                sg += tl.load(sp, mask=ok[:, None] & (r < rank_g)[None, :], other=0.0).to(tl.float32)
                su += tl.load(sp + R, mask=ok[:, None] & (r < rank_u)[None, :], other=0.0).to(tl.float32)
            sg = (sg * rs[:, None]).to(bg.dtype)
            su = (su * rs[:, None]).to(bu.dtype)
            g = tl.where(rank_g > 0, (g.to(tl.float32) + tl.dot(sg, bg, input_precision=PRECISION)).to(g.dtype), g)
            u = tl.where(rank_u > 0, (u.to(tl.float32) + tl.dot(su, bu, input_precision=PRECISION)).to(u.dtype), u)
            tl.store(out_ptr + t[:, None] * stride_o + col[None, :], _silu_mul(g, u).to(out_ptr.dtype.element_ty),
                     mask=xm)


SILU_LORA_BLOCK = 128  # columns per program
SILU_LORA_BLOCK_T = 16  # tokens of one group per tensor-core product (its smallest M)
SILU_LORA_WARPS = 4  # (64 / 128 columns x 2 / 4 / 8 warps: within 0.03 ms a step on the H100)


def silu_and_mul_lora(x: torch.Tensor, d, scale: RowScale | None = None) -> torch.Tensor:
    """silu_and_mul of x [T, 2N] after adding the gate_up LoRA delta d (a LoraDelta: sub-modules
    gate, up; d.groups the step's tokens grouped by slot) to x; x itself is not written. -> [T, N].
    scale: x and d.s project add_lora_rms_norm's unnormalised rows; its RowScale normalises them."""
    T, n2 = x.shape
    n = n2 // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    if T:
        S = d.b[0].shape[0]
        groups = d.groups
        assert groups is not None and groups.shape[0] == S + 1 and groups.stride(1) == 1
        ss, nb, inv_n, eps = _scale_args(scale, x)
        _silu_and_mul_lora_kernel[(S + 1, triton.cdiv(n, SILU_LORA_BLOCK))](
            x, out, d.s, d.b[0], d.b[1], d.ranks, groups, ss, n, d.rank, S, x.stride(0), out.stride(0),
            d.s.stride(0), d.s.stride(1), d.slot_stride, groups.stride(0), nb, inv_n, eps, BLOCK_T=SILU_LORA_BLOCK_T,
            BLOCK=SILU_LORA_BLOCK, **_rank_args(d.rank), NUM_SPLITS=d.s.shape[0],
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SCALED=scale is not None,
            NB=triton.next_power_of_2(nb), num_warps=SILU_LORA_WARPS)
    return out


def _rank_args(R: int) -> dict:
    """BLOCK_R (a power of two >= 16, the smallest tensor-core K) and RPAD of a stack of rank R."""
    block_r = max(16, triton.next_power_of_2(R))
    return {"BLOCK_R": block_r, "RPAD": block_r != R}


def _scale_args(scale, like: torch.Tensor) -> tuple:
    """-> (ss, nb, inv_n, eps) kernel arguments of a RowScale, or dummies for None (SCALED off)."""
    if scale is None:
        return like, 1, 1.0, 0.0
    return scale.ss, scale.ss.shape[1], 1.0 / scale.n, scale.eps


class RowScale(NamedTuple):
    """Each row's RMSNorm factor, left to the kernels after the next GEMM (add_lora_rms_norm).

    ss:  [T, nb] float32: row t's sums of squares, one per column block of the normalised rows
    n:   the hidden size (the mean's divisor)
    eps: the norm's epsilon
    """

    ss: torch.Tensor
    n: int
    eps: float


@triton.jit
def _add_lora_row(h_ptr, res_ptr, s_ptr, bf, rank, s0, t, col, m, R, stride_h, stride_r, stride_sp, stride_sm,
                  stride_ss, BLOCK_R: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """round(residual[t] + round(h[t] + delta)) at columns `col` (bf: the slot's B^T tile in fp32;
    rank 0: no delta). Loads only, no branch."""
    hv = tl.load(h_ptr + t * stride_h + col, mask=m, other=0.0)
    sv = _lora_s(s_ptr, rank, s0, t, 0, R, stride_sp, stride_sm, stride_ss, hv.dtype, BLOCK_R, NUM_SPLITS, 1.0)
    hv = tl.where(rank > 0, (hv.to(tl.float32) + tl.sum(bf * sv[:, None], axis=0)).to(hv.dtype), hv)
    return (tl.load(res_ptr + t * stride_r + col, mask=m, other=0.0).to(tl.float32) + hv.to(tl.float32)).to(hv.dtype)


@triton.jit
def _norm_row_out(h_ptr, res_ptr, ss_ptr, rv, w, t, col, m, cb, nb, stride_h, stride_r, ok):
    """Writes residual[t] <- rv, h[t] <- round(w * rv) and ss[t, cb] <- sum(rv^2) (fp32)."""
    tl.store(res_ptr + t * stride_r + col, rv, mask=m)
    rf = rv.to(tl.float32)
    tl.store(h_ptr + t * stride_h + col, (rf * w).to(rv.dtype), mask=m)
    tl.store(ss_ptr + t * nb + cb, tl.sum(rf * rf, axis=0), mask=ok)


@triton.jit
def _add_lora_norm_kernel(h_ptr, res_ptr, w_ptr, ss_ptr, s_ptr, b_ptr, rank_ptr, groups_ptr, n, R, S, nb, stride_h,
                          stride_r, stride_sp, stride_sm, stride_ss, stride_g, BLOCK_T: tl.constexpr,
                          BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, RPAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
                          PRECISION: tl.constexpr):
    """Program (group, column block), groups as in _silu_and_mul_lora_kernel: for each of the
    group's tokens t, h[t] + its LoRA delta (one rounding) is added to residual[t] (one rounding,
    written back), then h[t] <- round(weight * residual[t]) and ss[t, block] <- the block's sum of
    residual[t]^2 (fp32), which the consumer of the next GEMM turns into the RMSNorm factor."""
    lora, s0, row0, count = _token_group(groups_ptr, stride_g, S)
    if count == 0:  # (a slot no token of this step uses)
        return
    cb = tl.program_id(1)
    col = cb * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    r = tl.arange(0, BLOCK_R)
    rank = tl.where(lora, tl.load(rank_ptr + s0), 0)
    bt = tl.load(b_ptr + s0 * n * R + col[None, :] * R + r[:, None], mask=_b_mask(m[None, :], rank, r[:, None], R, RPAD),
                 other=0.0)  # [BLOCK_R, BLOCK] tile of B^T
    w = tl.load(w_ptr + col, mask=m, other=0.0).to(tl.float32)
    if count <= 2:  # one or two tokens: CUDA-core products, both rows read before either is written
        bf = bt.to(tl.float32)
        t0 = tl.load(row0 + 1).to(tl.int64)
        t1 = tl.load(row0 + 2, mask=count > 1, other=0).to(tl.int64)
        m1 = m & (count > 1)
        r0 = _add_lora_row(h_ptr, res_ptr, s_ptr, bf, rank, s0, t0, col, m, R, stride_h, stride_r, stride_sp,
                           stride_sm, stride_ss, BLOCK_R, NUM_SPLITS)
        r1 = _add_lora_row(h_ptr, res_ptr, s_ptr, bf, rank, s0, t1, col, m1, R, stride_h, stride_r, stride_sp,
                           stride_sm, stride_ss, BLOCK_R, NUM_SPLITS)
        _norm_row_out(h_ptr, res_ptr, ss_ptr, r0, w, t0, col, m, cb, nb, stride_h, stride_r, True)
        _norm_row_out(h_ptr, res_ptr, ss_ptr, r1, w, t1, col, m1, cb, nb, stride_h, stride_r, count > 1)
    else:  # BLOCK_T tokens at a time, tensor-core products
        for c0 in range(0, count, BLOCK_T):
            i = c0 + tl.arange(0, BLOCK_T)
            ok = i < count
            t = tl.load(row0 + 1 + i, mask=ok, other=0).to(tl.int64)
            xm = ok[:, None] & m[None, :]
            hv = tl.load(h_ptr + t[:, None] * stride_h + col[None, :], mask=xm, other=0.0)
            sv = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for p in tl.static_range(NUM_SPLITS):
                sv += tl.load(s_ptr + p * stride_sp + t[:, None] * stride_sm + s0 * stride_ss + r[None, :],
                              mask=ok[:, None] & (r < rank)[None, :], other=0.0).to(tl.float32)
            hv = tl.where(rank > 0,
                          (hv.to(tl.float32) + tl.dot(sv.to(bt.dtype), bt, input_precision=PRECISION)).to(hv.dtype), hv)
            res = res_ptr + t[:, None] * stride_r + col[None, :]
            rv = (tl.load(res, mask=xm, other=0.0).to(tl.float32) + hv.to(tl.float32)).to(hv.dtype)
            tl.store(res, rv, mask=xm)
            rf = rv.to(tl.float32)
            tl.store(h_ptr + t[:, None] * stride_h + col[None, :], (rf * w[None, :]).to(hv.dtype), mask=xm)
            tl.store(ss_ptr + t * nb + cb, tl.sum(rf * rf, axis=1), mask=ok)


ADD_NORM_BLOCK = 128  # columns per program
ADD_NORM_WARPS = 4  # (2 / 8: within 0.03 ms a step)


def add_lora_rms_norm(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, d) -> RowScale:
    """The residual add and RMSNorm before a projection, with h's LoRA delta d (a LoraDelta of one
    sub-module, d.groups the tokens grouped by slot) added first, column-parallel: the norm's
    division is left to the kernel after the next GEMM (linear in its input row).

    In place: residual <- residual + (h + delta), h <- weight * residual (the rows before their
    division by rms(residual)); returns the RowScale that silu_and_mul_lora / rope_store_kv apply.
    h [T, n] and residual [T, n]: unit column stride."""
    T, n = h.shape
    nb = triton.cdiv(n, ADD_NORM_BLOCK)
    ss = torch.empty(T, nb, dtype=torch.float32, device=h.device)
    if T:
        S = d.b[0].shape[0]
        groups = d.groups
        assert groups is not None and groups.shape[0] == S + 1 and groups.stride(1) == 1 and len(d.b) == 1
        assert h.stride(1) == 1 and residual.stride(1) == 1 and weight.is_contiguous()
        _add_lora_norm_kernel[(S + 1, nb)](
            h, residual, weight, ss, d.s, d.b[0], d.ranks, groups, n, d.rank, S, nb, h.stride(0), residual.stride(0),
            d.s.stride(0), d.s.stride(1), d.slot_stride, groups.stride(0), BLOCK_T=SILU_LORA_BLOCK_T,
            BLOCK=ADD_NORM_BLOCK, **_rank_args(d.rank), NUM_SPLITS=d.s.shape[0],
            PRECISION="ieee" if h.dtype == torch.float32 else "tf32", num_warps=ADD_NORM_WARPS)
    return RowScale(ss, n, eps)


@triton.jit
def _rotate_half_pair(x1, x2, cos, sin, dtype):
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    return (a * cos - b * sin).to(dtype), (b * cos + a * sin).to(dtype)


@triton.jit
def _rope_lora_tiles(bq_ptr, bk_ptr, bv_ptr, rank_ptr, lslot, head, j, half, full, ok, HQ, HK, R, D: tl.constexpr,
                     BLOCK_R: tl.constexpr, RPAD: tl.constexpr):
    """-> (b1, b2, bv, sub, rank, rank_v) of program (token, head): the B tiles of q's or k's rows
    of the head's two halves (sub-module `sub`: 0 = q, 1 = k) and of v's rows for a kv head, and
    the true ranks of their sub-modules; ranks 0 (empty tiles, nothing read) where the token has
    no adapter, and rank_v 0 for a q head."""
    if head < HQ:
        b_ptr = bq_ptr
        sub = 0
        n_out = HQ * D
        c0 = head * D
    else:
        b_ptr = bk_ptr
        sub = 1
        n_out = HK * D
        c0 = j * D
    has = lslot >= 0
    at = rank_ptr + tl.maximum(lslot, 0) * 3
    rank = tl.where(has, tl.load(at + sub), 0)
    rank_v = tl.where(has & (head >= HQ), tl.load(at + 2), 0)
    b1 = _lora_b(b_ptr, rank, lslot, c0 + half, ok, n_out, R, BLOCK_R, RPAD)
    b2 = _lora_b(b_ptr, rank, lslot, c0 + D // 2 + half, ok, n_out, R, BLOCK_R, RPAD)
    bvt = _lora_b(bv_ptr, rank_v, lslot, j * D + full, full < D, HK * D, R, BLOCK_R, RPAD)
    return b1, b2, bvt, sub, rank, rank_v


@triton.jit
def _rope_store_kernel(qkv_ptr, pos_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr, s_ptr, bq_ptr, bk_ptr, bv_ptr, rank_ptr,
                       lslot_ptr, ss_ptr, R, stride_qkv, stride_sp, stride_sm, stride_ss, stride_cs, HQ, HK, nb, inv_n,
                       eps, D: tl.constexpr, LORA: tl.constexpr, BLOCK_R: tl.constexpr, RPAD: tl.constexpr,
                       NUM_SPLITS: tl.constexpr, PDL: tl.constexpr, SCALED: tl.constexpr, NB: tl.constexpr):
    """Program (token, head): head < HQ rotates q head `head` in place; otherwise, for kv head
    j = head - HQ, rotates k head j in place and writes it and v head j at the token's cache slot.
    SCALED: qkv (and s) project add_lora_rms_norm's unnormalised rows: each is first multiplied by
    the token's RMSNorm factor and rounded (written back too: qkv ends as the true projection).
    Everything is read before anything is written (a store would hold later loads back)."""
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dtype = qkv_ptr.dtype.element_ty
    half = tl.arange(0, D // 2)
    full = tl.arange(0, D)
    ok = half < D // 2
    j = tl.maximum(head - HQ, 0)
    kv = head >= HQ
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the GEMM that wrote qkv is complete
    if LORA:
        lslot = tl.load(lslot_ptr + t)
        b1, b2, bvt, sub, rank, rank_v = _rope_lora_tiles(bq_ptr, bk_ptr, bv_ptr, rank_ptr, lslot, head, j, half, full,
                                                          ok, HQ, HK, R, D, BLOCK_R, RPAD)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cs_ptr + pos * stride_cs + half)
    sin = tl.load(cs_ptr + pos * stride_cs + D // 2 + half)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    row = qkv_ptr + t * stride_qkv
    if head < HQ:
        base = row + head * D  # q head `head`
    else:
        base = row + HQ * D + j * D  # k head j
    vbase = row + (HQ + HK) * D + j * D  # v head j (for a kv head)
    x1 = tl.load(base + half)
    x2 = tl.load(base + D // 2 + half)
    v = tl.load(vbase + full, mask=(full < D) & kv, other=0.0)
    rs = 1.0
    if SCALED:
        rs = _row_scale(ss_ptr, t, nb, inv_n, eps, NB)
        x1 = (x1.to(tl.float32) * rs).to(dtype)
        x2 = (x2.to(tl.float32) * rs).to(dtype)
        v = (v.to(tl.float32) * rs).to(dtype)
    if LORA:
        x1 = _lora_add(x1, b1, s_ptr, rank, lslot, t, sub, R, stride_sp, stride_sm, stride_ss, BLOCK_R, NUM_SPLITS, rs)
        x2 = _lora_add(x2, b2, s_ptr, rank, lslot, t, sub, R, stride_sp, stride_sm, stride_ss, BLOCK_R, NUM_SPLITS, rs)
        v = _lora_add(v, bvt, s_ptr, rank_v, lslot, t, 2, R, stride_sp, stride_sm, stride_ss, BLOCK_R, NUM_SPLITS, rs)
    o1, o2 = _rotate_half_pair(x1, x2, cos, sin, dtype)
    tl.store(base + half, o1)
    tl.store(base + D // 2 + half, o2)
    if kv:  # v back, and k and v into the cache
        if SCALED or LORA:
            tl.store(vbase + full, v)
        if slot >= 0:
            cache = slot * (HK * D) + j * D
            tl.store(kc_ptr + cache + half, o1)
            tl.store(kc_ptr + cache + D // 2 + half, o2)
            tl.store(vc_ptr + cache + full, v)


ROPE_WARPS = 4  # (1 / 2: within 0.03 ms a step, base and LoRA)


def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slots: torch.Tensor, d=None, scale: RowScale | None = None) -> None:
    """In place on qkv [T, (Hq + 2 Hk) * D] (rows contiguous): the qkv LoRA delta d (a LoraDelta, sub-
    modules q, k, v; None = no LoRA) added, q and k rotated (neox form, cos / sin from the float32
    [P, D] table: cos half then sin half), and k and v written at flat `slots` of the caches
    [blocks, block_size, Hk, D] (contiguous; slot -1 writes nothing): RoPE, the K/V store and the
    LoRA expand in one launch. scale: qkv and d.s project add_lora_rms_norm's unnormalised rows;
    its RowScale normalises them first."""
    T = qkv.shape[0]
    if not T:
        return
    lora = d is not None
    pdl = _pdl(qkv.device) and not lora and scale is None
    s = d.s if lora else qkv
    bq, bk, bv = d.b if lora else (qkv, qkv, qkv)
    ss, nb, inv_n, eps = _scale_args(scale, qkv)
    _rope_store_kernel[(T, num_heads + num_kv_heads)](
        qkv, positions, cos_sin_cache, k_cache, v_cache, slots, s, bq, bk, bv, d.ranks if lora else slots,
        d.token_slot if lora else slots, ss, d.rank if lora else 1, qkv.stride(0), s.stride(0) if lora else 0,
        s.stride(1) if lora else 0, d.slot_stride if lora else 0, cos_sin_cache.stride(0), num_heads, num_kv_heads, nb,
        inv_n, eps, D=head_dim, LORA=lora, **_rank_args(d.rank if lora else 16), NUM_SPLITS=s.shape[0] if lora else 1,
        PDL=pdl, SCALED=scale is not None, NB=triton.next_power_of_2(nb), num_warps=ROPE_WARPS, **_launch(pdl))
