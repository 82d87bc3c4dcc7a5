"""Triton LoRA kernels (Punica style): tokens in any order, each with its own adapter slot.

Input: the step's activations x, the manager's slot stacks of one (layer, fused module) and the
per-token slot list `token_slot` (a device tensor: under a CUDA graph the runner rewrites it
before each replay, so nothing here depends on host values of the mapping). Output: y += the
LoRA delta, in place. Two launches per fused module, whatever its number of sub-modules:

    shrink   s[p, t, i*R + r] = sum_{k in split p} x[t, k] * A[slot_t, i*R + r, k]
             A: [num_slots, n_sub * R, in]   all sub-modules (q|k|v) in one pass over x
    expand   y[t, off_i + n] += sum_p sum_r s[p, t, i*R + r] * B_i[slot_t, n, r]
             B_i: [num_slots, out_i, R]      one grid over the concatenated output columns:

    grid axis 2 (expand):  | blocks of q (out_0) | blocks of k (out_1) | blocks of v (out_2) |
                             sub = 0, off_0 = 0    sub = 1, off_1 = q    sub = 2, off_2 = q + kv

Slot-major grids: program (slot, ...) handles the tokens of one slot, BLOCK_T at a time, so each
adapter's weight tile is read once per step however many tokens use it, and slots no token uses
cost one look at token_slot. Which tokens: either a scan of token_slot (`segments` None: what a
CUDA graph replays; a chunk of BLOCK_T consecutive tokens per program, masked to the slot), or
the host's grouping (`segments` = LoraSegments: the slot's tokens perm[indptr[s]:indptr[s+1]],
no wasted rows; what eager steps, prefill above all, use).

R is the stacks' padded rank; ranks [num_slots, n_sub] (int32, device) gives each slot's true rank
per sub-module, and columns r >= rank are masked out (no memory read), so a rank-16 adapter in a
max_rank-64 stack, or a module the adapter does not adapt (rank 0), costs what it holds. Tokens
with slot -1 are never touched. bf16 / fp16 / fp32 inputs, fp32 accumulation; s is fp32 and holds
one partial sum per split of the `in` dimension (split-K without atomics: deterministic). On
Hopper, when the expand directly follows the shrink in one stream, it is launched as a
programmatic dependent launch: it reads its weight tile while the shrink still runs and waits
for it (griddepcontrol.wait) before reading s and y. When the shrink runs on a side stream
(LoraBatch.begin / finish) the expand follows other kernels and is launched plainly (pdl=False).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

MAX_BLOCK_T = 64  # tokens of one slot per program (a chunk); more tokens -> more chunks
BLOCK_K = 128  # shrink: `in` columns per loop step
BLOCK_N = 128  # expand: output columns per program
MAX_SPLITS = 4  # more splits make the expand sum more partials (benchmarks/sweep_lora.py: 4 is best at batch 32)
PROGRAMS_PER_SM = 4  # shrink: split K until about this many programs per multiprocessor
NUM_WARPS = 4
PDL = True  # programmatic dependent launch of the expand, where the GPU has it


class LoraSegments(NamedTuple):
    """The host's grouping of one step's tokens by slot (LoraBatch), for the segmented schedule.

    perm:        [N] int, device: the tokens that use an adapter, grouped by slot
    indptr:      [num_slots + 1] int32, device: slot s's tokens are perm[indptr[s]:indptr[s+1]]
    max_tokens:  host int: the most tokens any slot has (sizes the grid)
    """

    perm: torch.Tensor
    indptr: torch.Tensor
    max_tokens: int


@triton.jit
def _slot_rows(slot, chunk, token_slot_ptr, perm_ptr, indptr_ptr, T, SEGMENTED: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """Chunk `chunk` of the tokens that use `slot` -> (rows [BLOCK_T] int64, valid [BLOCK_T])."""
    i = chunk * BLOCK_T + tl.arange(0, BLOCK_T)
    if SEGMENTED:
        start = tl.load(indptr_ptr + slot)
        ok = start + i < tl.load(indptr_ptr + slot + 1)
        rows = tl.load(perm_ptr + start + i, mask=ok, other=0)
    else:
        ok = i < T
        ok = ok & (tl.load(token_slot_ptr + i, mask=ok, other=-1) == slot)
        rows = i
    return rows.to(tl.int64), ok


@triton.jit
def _sub_block(pid_n, n0, n1, n2, o0, o1, o2, BLOCK_N: tl.constexpr):
    """Column block pid_n of the concatenated output -> (sub-module, its first column, y offset, out_sub)."""
    nb0 = tl.cdiv(n0, BLOCK_N)
    nb1 = tl.cdiv(n1, BLOCK_N)
    sub = (pid_n >= nb0).to(tl.int32) + (pid_n >= nb0 + nb1).to(tl.int32)
    first = (pid_n - tl.where(sub == 0, 0, tl.where(sub == 1, nb0, nb0 + nb1))) * BLOCK_N
    y_off = tl.where(sub == 0, o0, tl.where(sub == 1, o1, o2))
    n_out = tl.where(sub == 0, n0, tl.where(sub == 1, n1, n2))
    return sub, first, y_off, n_out


@triton.jit
def _shrink(x_ptr, a_ptr, rank_ptr, token_slot_ptr, perm_ptr, indptr_ptr, s_ptr, T, K, R, R_total, n_sub, r_blocks,
            k_per_split, stride_xm, stride_as, stride_sp, stride_sm,
            SEGMENTED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
            PRECISION: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()  # the expand may start; it waits for this kernel before reading s
    slot, pid_k = tl.program_id(0), tl.program_id(1)
    chunk, pid_r = tl.program_id(2) // r_blocks, tl.program_id(2) % r_blocks
    j = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rank = tl.load(rank_ptr + slot * n_sub + j // R, mask=j < R_total, other=0)
    rows, ok = _slot_rows(slot, chunk, token_slot_ptr, perm_ptr, indptr_ptr, T, SEGMENTED, BLOCK_T)
    if tl.max(ok.to(tl.int32), axis=0) > 0:
        j_ok = (j < R_total) & (j % R < rank)
        acc = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
        for kk in range(0, k_per_split, BLOCK_K):
            k = pid_k * k_per_split + kk + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=ok[:, None] & (k < K)[None, :],
                         other=0.0)
            av = tl.load(a_ptr + slot.to(tl.int64) * stride_as + j[None, :] * K + k[:, None],
                         mask=j_ok[None, :] & (k < K)[:, None], other=0.0)
            acc = tl.dot(xv, av, acc, input_precision=PRECISION)
        tl.store(s_ptr + pid_k * stride_sp + rows[:, None] * stride_sm + j[None, :], acc,
                 mask=ok[:, None] & (j < R_total)[None, :])


@triton.jit
def _expand(s_ptr, b0_ptr, b1_ptr, b2_ptr, rank_ptr, token_slot_ptr, perm_ptr, indptr_ptr, y_ptr, T, R, n_sub,
            num_splits, n0, n1, n2, o0, o1, o2, stride_sp, stride_sm, stride_ss, stride_ym,
            SEGMENTED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
            RPAD: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    slot, chunk = tl.program_id(0), tl.program_id(1)
    sub, first, y_off, n_out = _sub_block(tl.program_id(2), n0, n1, n2, o0, o1, o2, BLOCK_N)
    if sub == 0:
        b_ptr = b0_ptr
    elif sub == 1:
        b_ptr = b1_ptr
    else:
        b_ptr = b2_ptr
    r = tl.arange(0, BLOCK_R)
    rank = tl.load(rank_ptr + slot * n_sub + sub)
    rows, ok = _slot_rows(slot, chunk, token_slot_ptr, perm_ptr, indptr_ptr, T, SEGMENTED, BLOCK_T)
    used = tl.max(ok.to(tl.int32), axis=0) > 0
    r_ok = used & (r < rank)
    n = first + tl.arange(0, BLOCK_N)
    # weights, ranks and slots are written by no kernel of this step: read them before the wait;
    # whole rows of B (zero past the rank; s is masked by it), so that the mask is constant along r
    # and the tile is read in 16-byte vectors (model_wrapper/kernels/lora_epilogues._b_mask)
    b_ok = (n < n_out)[None, :] & used & (rank > 0)
    if RPAD:
        b_ok = b_ok & (r < R)[:, None]
    bv = tl.load(b_ptr + slot.to(tl.int64) * n_out * R + n[None, :] * R + r[:, None], mask=b_ok, other=0.0)
    if PDL:
        gdc_wait()  # the shrink (s) and everything before it (y) are complete
    if used:
        sv = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
        for p in range(num_splits):
            sv += tl.load(s_ptr + p * stride_sp + rows[:, None] * stride_sm + slot * stride_ss + sub * R
                          + r[None, :], mask=ok[:, None] & r_ok[None, :], other=0.0).to(tl.float32)
        delta = tl.dot(sv.to(bv.dtype), bv, input_precision=PRECISION)
        y = y_ptr + rows[:, None] * stride_ym + y_off + n[None, :]
        y_ok = ok[:, None] & (n < n_out)[None, :]
        tl.store(y, (tl.load(y, mask=y_ok, other=0.0).to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=y_ok)


# -- host wrappers ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the interpreter (tests): a few splits, cheap to run
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch of the expand (Hopper and later; not in the interpreter)."""
    return PDL and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _pdl_launch(device: torch.device) -> dict:
    return dict(launch_pdl=True) if _pdl(device) else {}


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # ignored for 16-bit operands


def _chunks(T: int, segments: LoraSegments | None) -> tuple[int, int]:
    """-> (BLOCK_T, chunks per slot)."""
    n = T if segments is None else segments.max_tokens
    block_t = _pow2(n, 16, MAX_BLOCK_T)
    return block_t, max(1, triton.cdiv(n, block_t))


def _mapping_args(token_slot, segments):
    if segments is None:
        return token_slot, token_slot, token_slot  # perm / indptr never read
    return token_slot, segments.perm, segments.indptr


def _shrink_plan(x: torch.Tensor, a: torch.Tensor, segments: LoraSegments | None) -> tuple[int, ...]:
    """-> (BLOCK_T, chunks, BLOCK_R, r_blocks, BLOCK_K, splits, k_per_split) of the shrink's grid."""
    T, K = x.shape
    num_slots, R_total = a.shape[0], a.shape[1]
    block_t, chunks = _chunks(T, segments)
    block_r = _pow2(R_total, 16, 64)
    r_blocks = triton.cdiv(R_total, block_r)
    block_k = min(BLOCK_K, _pow2(K, 16, BLOCK_K))
    splits = max(1, min(MAX_SPLITS, triton.cdiv(K, block_k),
                        triton.cdiv(PROGRAMS_PER_SM * _num_sms(x.device), num_slots * chunks * r_blocks)))
    k_per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    return block_t, chunks, block_r, r_blocks, block_k, triton.cdiv(K, k_per_split), k_per_split


def lora_shrink_out(x: torch.Tensor, a: torch.Tensor, segments: LoraSegments | None = None) -> torch.Tensor:
    """The uninitialised s that lora_shrink(x, a, ..., segments) writes, on the current stream:
    allocate it here on the stream that will read it when the shrink runs on another one."""
    splits = _shrink_plan(x, a, segments)[5]
    return torch.empty(splits, x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, token_slot: torch.Tensor, ranks: torch.Tensor, rank: int,
                segments: LoraSegments | None = None, *, out: torch.Tensor | None = None,
                pdl: bool = True) -> torch.Tensor:
    """s = x @ A[slot]^T per token, all sub-modules at once; returns fp32 partial sums.

    x:          [T, in] bf16 / fp16 / fp32, unit column stride
    a:          [num_slots, n_sub * rank, in], contiguous (one layer of LoraManager.lora_a[module])
    token_slot: [>= T] int32, device: slot of token t, -1 = no adapter; read as [:T]
    ranks:      [num_slots, n_sub] int32, device: true rank per slot and sub-module (<= rank)
    segments:   the host's grouping by slot (same tokens as token_slot), or None to scan token_slot
    out:        lora_shrink_out(x, a, segments), or None to allocate it here
    pdl:        let a programmatic dependent launch of the expand start early (where the GPU has it);
                False when the expand is not the next kernel of this stream
    returns     s [splits, T, n_sub * rank] float32; rows of tokens without an adapter are unwritten
    """
    T, K = x.shape
    num_slots, R_total = a.shape[0], a.shape[1]
    block_t, chunks, block_r, r_blocks, block_k, splits, k_per_split = _shrink_plan(x, a, segments)
    s = torch.empty(splits, T, R_total, dtype=torch.float32, device=x.device) if out is None else out
    assert s.shape == (splits, T, R_total) and s.dtype == torch.float32 and s.is_contiguous()
    if T == 0 or (segments is not None and segments.max_tokens == 0):
        return s
    assert x.stride(1) == 1 and a.is_contiguous() and ranks.is_contiguous()
    _shrink[(num_slots, splits, chunks * r_blocks)](
        x, a, ranks, *_mapping_args(token_slot, segments), s, T, K, rank, R_total, R_total // rank, r_blocks,
        k_per_split, x.stride(0), a.stride(0), s.stride(0), s.stride(1), SEGMENTED=segments is not None,
        BLOCK_T=block_t, BLOCK_R=block_r, BLOCK_K=block_k, PRECISION=_precision(x.dtype),
        PDL=pdl and _pdl(x.device), num_warps=NUM_WARPS)
    return s


def lora_expand_add(s: torch.Tensor, b: tuple[torch.Tensor, ...], token_slot: torch.Tensor, ranks: torch.Tensor,
                    rank: int, y: torch.Tensor, out_offsets: tuple[int, ...],
                    segments: LoraSegments | None = None, *, pdl: bool = True, slot_stride: int = 0) -> torch.Tensor:
    """y[t, off_i:off_i+out_i] += s_i[t] @ B_i[slot]^T for every sub-module i, in one launch; returns y.

    s:           [splits, T, n_sub * rank] float32 from lora_shrink (partials are summed here); or,
                 with slot_stride > 0, [1, T, num_slots * slot_stride] (any float dtype, unit column
                 stride) holding every slot's shrink for every token, token t's own at columns
                 slot_t * slot_stride + i * rank + r (a folded GEMM's extra columns: LoraManager.fold_into)
    b:           1 to 3 stacks B_i [num_slots, out_i, rank], contiguous (one layer of LoraManager.lora_b)
    y:           [T, out_total] bf16 / fp16 / fp32, unit column stride; rows without an adapter unchanged
    out_offsets: [n_sub + 1] column offsets of the sub-modules in y (LoraShapes.out_offsets)
    token_slot, ranks, segments: as in lora_shrink
    pdl:         launch as a programmatic dependent of the previous kernel of this stream, which must
                 then be the shrink of s (where the GPU has PDL); False: a plain launch
    """
    splits, T, _ = s.shape
    if T == 0 or (segments is not None and segments.max_tokens == 0):
        return y
    assert 1 <= len(b) <= 3 and y.stride(1) == 1 and s.stride(2) == 1 and all(t.is_contiguous() for t in b)
    block_t, chunks = _chunks(T, segments)
    outs = [t.shape[1] for t in b] + [0] * (3 - len(b))
    offs = list(out_offsets[:len(b)]) + [0] * (3 - len(b))
    bs = list(b) + [b[0]] * (3 - len(b))
    n_blocks = sum(triton.cdiv(n, BLOCK_N) for n in outs)
    _expand[(b[0].shape[0], chunks, n_blocks)](
        s, *bs, ranks, *_mapping_args(token_slot, segments), y, T, rank, len(b), splits, *outs, *offs,
        s.stride(0), s.stride(1), slot_stride, y.stride(0), SEGMENTED=segments is not None, BLOCK_T=block_t,
        BLOCK_N=BLOCK_N,
        BLOCK_R=_pow2(rank, 16, 128), RPAD=_pow2(rank, 16, 128) != rank, PRECISION=_precision(y.dtype),
        PDL=pdl and _pdl(y.device),
        num_warps=NUM_WARPS, **(_pdl_launch(y.device) if pdl else {}))
    return y
