"""What several kernel families share: programmatic dependent launch, the GPU-generation checks,
and the SiLU-and-mul arithmetic of every kernel that ends in it.

Programmatic dependent launch (PDL, Hopper and later, not under the interpreter): a kernel is
launched while the kernel before it drains and waits (gdc_wait) before reading that kernel's
output. The kernels that use it also let the next kernel launch at once (gdc_launch_dependents
on entry): that kernel may then read, before its own wait, only what no kernel of the step
writes (gemv: its weights). The LoRA-fused epilogues do not use it (no gain measured).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401 (re-exported to the kernels)

from model_wrapper.kernels.config import KernelConfig

DEFAULT = KernelConfig()


@functools.lru_cache(maxsize=None)
def _sm90_plus(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def uses_pdl(device: torch.device, cfg: KernelConfig) -> bool:
    """Whether a kernel on `device` launches with PDL: cfg.pdl on an sm90+ GPU."""
    return cfg.pdl and _sm90_plus(device)


def launch_args(pdl: bool) -> dict:
    """The launch keywords of a kernel launched with (or without) PDL."""
    return dict(launch_pdl=True) if pdl else {}


@functools.cache
def sm90(device: torch.device) -> bool:
    """Hopper exactly: the skinny and wide GEMMs' configs (shared memory, TMA) are its own."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def tma_fits(w: torch.Tensor) -> bool:
    """Whether a TMA tensor descriptor takes the weights w [..., K] as rows of K: contiguous, 16-byte aligned, rows
    of a multiple of 16 bytes."""
    return w.is_contiguous() and w.data_ptr() % 16 == 0 and w.shape[-1] * w.element_size() % 16 == 0


def weight_descriptor(w: torch.Tensor, block_rows: int, block_k: int):
    """A host TMA tensor descriptor of w [..., K] (tma_fits) as [rows, K] with [block_rows, block_k] blocks: a kernel's
    weight tiles (rows past a matrix's own, or past the tensor, come back as the next rows or zeros; so do columns
    past K): the MoE grouped GEMMs' experts [E, rows, K], the e4m3 skinny GEMM's [N, K]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(w.reshape(-1, w.shape[-1]), [block_rows, block_k])


SM90_SHARED_MEMORY = 232448  # bytes of shared memory a Hopper program may opt into (H100, H200)


@functools.cache
def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory a program on `device` may have: the limit Triton checks at launch (232448 on sm90,
    101376 on sm89, e.g. an L4 or L40S); off CUDA (the interpreter has none) sm90's."""
    if device.type != "cuda":
        return SM90_SHARED_MEMORY
    from triton.runtime import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])


def stages_that_fit(stages: int, stage_bytes: int, shared: int, reserve: int = 1024) -> int:
    """A software pipeline's depth: `stages`, fewer where that many buffers of stage_bytes (Triton keeps one a
    stage) and `reserve` bytes (barriers, the epilogue's scratch: 512 in fp8_skinny_mma's sm90 builds) would not
    fit `shared` bytes; at least 1."""
    return max(1, min(stages, (shared - reserve) // stage_bytes))


@triton.jit
def silu_mul(g, u):
    """silu(g) * u in fp32 (g, u of any float dtype)."""
    g = g.to(tl.float32)
    return g / (1.0 + tl.exp(-g)) * u.to(tl.float32)


@triton.jit
def skinny_rows(w_ptr, s_ptr, stride_w, stride_s, N, M, ROWS: tl.constexpr, BM: tl.constexpr, PDL: tl.constexpr):
    """The FP8 skinny GEMMs' prologue (kernels/fp8.py, fp8_skinny_mma.py): this program's ROWS weight rows (rows,
    live = rows < N, their row pointers into w and the scales s, rows past N clamped to row 0) and the BM token
    slots (toks, tok_ok = toks < M); with PDL, the next kernel may launch now and this one waits for the kernel
    that wrote its input. -> (rows, live, w_rows, s_rows, toks, tok_ok)"""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < N
    safe = tl.where(live, rows, 0).to(tl.int64)
    toks = tl.arange(0, BM)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    return rows, live, w_ptr + safe[:, None] * stride_w, s_ptr + safe * stride_s, toks, toks < M


@triton.jit
def skinny_store(acc, up, b_ptr, o_ptr, rows, live, toks, tok_ok, N, stride_o, HAS_BIAS: tl.constexpr,
                 SILU: tl.constexpr):
    """The skinny GEMMs' epilogue (kernels/gemm.py, fp8.py, fp8_skinny_mma.py): fp32 sums acc [ROWS, BM] of rows x
    tokens (SILU: gate rows in acc, their up rows in up) plus the bias (up's at N + rows), each product rounded to
    o's dtype, SILU: silu_mul of the two, stored transposed at o[toks, rows]."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=live, other=0.0).to(tl.float32)[:, None]
        if SILU:
            up += tl.load(b_ptr + N + rows, mask=live, other=0.0).to(tl.float32)[:, None]
    dtype = o_ptr.dtype.element_ty
    if SILU:
        acc = silu_mul(acc.to(dtype), up.to(dtype))
    tl.store(o_ptr + toks[None, :] * stride_o + rows[:, None], acc.to(dtype), mask=live[:, None] & tok_ok[None, :])


_COUNTERS: dict = {}


def device_counters(owner: str, n: int, device: torch.device) -> torch.Tensor:
    """owner's n int32 counters on device (zero between launches: the kernel that counts on them resets each one it
    used, see last_to_arrive), made once, on the first (eager, warm-up) call; a graph capture then records their
    address. Kernels that count on them run in stream order (a PDL launch waits before it counts)."""
    c = _COUNTERS.get((owner, device))
    if c is None:
        c = _COUNTERS[(owner, device)] = torch.zeros(n, dtype=torch.int32, device=device)
    elif c.numel() < n:  # (never replaced: a captured graph may hold the address)
        raise ValueError(f"device_counters: {owner} has {c.numel()} counters on {device}, asked for {n}")
    return c


@triton.jit
def last_to_arrive(count_ptr, programs):
    """Whether this program is the last of `programs` to reach this point, counted at count_ptr: every thread's
    stores before it made visible first (a barrier, then the count with acq_rel at GPU scope, cumulative over the
    barrier), so the last program reads the others' stores (through L2: cache_modifier=".cg"). That program then
    resets the count for the next launch (tl.atomic_xchg(count_ptr, 0): a graph replays the same launch)."""
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == programs - 1


@triton.jit
def loads_fence():
    """A CTA-scope fence: ptxas issues every load before it ahead of it, instead of sinking loads into the
    products that follow (the GEMVs' next row block, the MoE gate_up GEMV's weights). CUDA only."""
    tl.inline_asm_elementwise("fence.acq_rel.cta; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
