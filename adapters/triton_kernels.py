"""Triton LoRA kernels (Punica BGMV style): tokens in any order, each with its own adapter slot.

Input: the step's activations x, the manager's slot stacks of one (layer, fused module) and the
per-token slot list `token_slot` (a device tensor: under a CUDA graph the runner rewrites it
before each replay, so nothing here depends on host values of the mapping). Output: y += the
LoRA delta, in place. Two launches per fused module, whatever its number of sub-modules:

    shrink   s[p, t, i*R + r] = sum_{k in split p} x[t, k] * A[slot_t, i*R + r, k]
             A: [num_slots, n_sub * R, in]   all sub-modules (q|k|v) in one pass over x
    expand   y[t, off_i + n] += sum_p sum_r s[p, t, i*R + r] * B_i[slot_t, n, r]
             B_i: [num_slots, out_i, R]      one grid over the concatenated output columns:

    grid axis 1:  | blocks of q (out_0) | blocks of k (out_1) | blocks of v (out_2) |
                    sub = 0, off_0 = 0    sub = 1, off_1 = q    sub = 2, off_2 = q + kv

R is the stacks' padded rank; ranks [num_slots, n_sub] (int32, device) gives each slot's true rank
per sub-module, and columns r >= rank are masked out (no memory read), so a rank-16 adapter in a
max_rank-64 stack, or a module the adapter does not adapt (rank 0), costs what it holds. Tokens
with slot -1 exit early and leave y untouched. bf16 / fp16 / fp32 inputs, fp32 accumulation; s is
fp32 and holds one partial sum per split of the `in` dimension (split-K without atomics, so the
result is deterministic; the expand adds the partials).

Two schedules, chosen by the number of rows (ROWWISE_MAX_ROWS):
  rowwise  one program per token (x column tile); GEMV by elementwise products and sums. For
           decode: as many programs as tokens x tiles, no sorting, no host metadata.
  blocked  BLOCK_M rows per program; a loop over the distinct slots among those rows, one tl.dot
           per slot. For prefill: given `rows` (the LoRA tokens grouped by slot, LoraBatch.perm),
           a block holds one or two slots and each weight tile is read once per block.
Both are exact for any order of tokens; only their speed depends on it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

ROWWISE_MAX_ROWS = 64  # up to this many rows: one program per token, else BLOCK_M rows per program
BLOCK_M = 32  # rows per program in the blocked schedule (>= 16 for tl.dot)
MAX_SPLITS = 16
ROWWISE_BLOCK_K = 128  # shrink: `in` columns per step of the loop
ROWWISE_TILE = 4096  # expand: BLOCK_N * BLOCK_R elements of B per program
PROGRAMS_PER_SM = 2  # shrink: split K until about this many programs per multiprocessor


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
def _shrink_rowwise(x_ptr, a_ptr, slot_ptr, rank_ptr, rows_ptr, s_ptr, K, R, R_total, n_sub, k_per_split,
                    stride_xm, stride_as, stride_sp, stride_sm,
                    HAS_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_k, pid_r = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = (tl.load(rows_ptr + pid_m) if HAS_ROWS else pid_m).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        j = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        rank = tl.load(rank_ptr + slot * n_sub + j // R, mask=j < R_total, other=0)
        j_ok = (j < R_total) & (j % R < rank)
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        for kk in range(0, k_per_split, BLOCK_K):
            k = pid_k * k_per_split + kk + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
            av = tl.load(a_ptr + slot * stride_as + j[:, None] * K + k[None, :],
                         mask=j_ok[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(av * xv[None, :], axis=1)
        tl.store(s_ptr + pid_k * stride_sp + row * stride_sm + j, acc, mask=j < R_total)


@triton.jit
def _expand_rowwise(s_ptr, b0_ptr, b1_ptr, b2_ptr, slot_ptr, rank_ptr, rows_ptr, y_ptr, R, n_sub, num_splits,
                    n0, n1, n2, o0, o1, o2, stride_sp, stride_sm, stride_ym,
                    HAS_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    row = (tl.load(rows_ptr + pid_m) if HAS_ROWS else pid_m).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        sub, first, y_off, n_out = _sub_block(pid_n, n0, n1, n2, o0, o1, o2, BLOCK_N)
        if sub == 0:
            b_ptr = b0_ptr
        elif sub == 1:
            b_ptr = b1_ptr
        else:
            b_ptr = b2_ptr
        rank = tl.load(rank_ptr + slot * n_sub + sub)
        r = tl.arange(0, BLOCK_R)
        r_ok = r < rank
        sv = tl.zeros([BLOCK_R], dtype=tl.float32)
        for p in range(num_splits):
            sv += tl.load(s_ptr + p * stride_sp + row * stride_sm + sub * R + r, mask=r_ok, other=0.0)
        n = first + tl.arange(0, BLOCK_N)
        n_ok = n < n_out
        bv = tl.load(b_ptr + slot * n_out * R + n[:, None] * R + r[None, :],
                     mask=n_ok[:, None] & r_ok[None, :], other=0.0).to(tl.float32)
        delta = tl.sum(bv * sv[None, :], axis=1)
        y = y_ptr + row * stride_ym + y_off + n
        tl.store(y, (tl.load(y, mask=n_ok, other=0.0).to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _block_rows(rows_ptr, slot_ptr, N, HAS_ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = (tl.load(rows_ptr + i, mask=i < N, other=0) if HAS_ROWS else i).to(tl.int64)
    slots = tl.load(slot_ptr + rows, mask=i < N, other=-1)
    return rows, slots


@triton.jit
def _shrink_blocked(x_ptr, a_ptr, slot_ptr, rank_ptr, rows_ptr, s_ptr, N, K, R, R_total, n_sub, k_per_split,
                    stride_xm, stride_as, stride_sp, stride_sm,
                    HAS_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                    PRECISION: tl.constexpr):
    pid_k, pid_r = tl.program_id(1), tl.program_id(2)
    rows, slots = _block_rows(rows_ptr, slot_ptr, N, HAS_ROWS, BLOCK_M)
    todo = slots >= 0
    j = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    while tl.max(todo.to(tl.int32), axis=0) > 0:  # one pass per distinct slot among the rows
        cur = tl.min(tl.where(todo, slots, 2147483647), axis=0)
        sel = todo & (slots == cur)
        rank = tl.load(rank_ptr + cur.to(tl.int64) * n_sub + j // R, mask=j < R_total, other=0)
        j_ok = (j < R_total) & (j % R < rank)
        acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for kk in range(0, k_per_split, BLOCK_K):
            k = pid_k * k_per_split + kk + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=sel[:, None] & (k < K)[None, :],
                         other=0.0)
            av = tl.load(a_ptr + cur.to(tl.int64) * stride_as + j[None, :] * K + k[:, None],
                         mask=j_ok[None, :] & (k < K)[:, None], other=0.0)
            acc = tl.dot(xv, av, acc, input_precision=PRECISION)
        tl.store(s_ptr + pid_k * stride_sp + rows[:, None] * stride_sm + j[None, :], acc,
                 mask=sel[:, None] & (j < R_total)[None, :])
        todo = todo & (slots != cur)


@triton.jit
def _expand_blocked(s_ptr, b0_ptr, b1_ptr, b2_ptr, slot_ptr, rank_ptr, rows_ptr, y_ptr, N, R, n_sub, num_splits,
                    n0, n1, n2, o0, o1, o2, stride_sp, stride_sm, stride_ym,
                    HAS_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                    PRECISION: tl.constexpr):
    rows, slots = _block_rows(rows_ptr, slot_ptr, N, HAS_ROWS, BLOCK_M)
    sub, first, y_off, n_out = _sub_block(tl.program_id(1), n0, n1, n2, o0, o1, o2, BLOCK_N)
    if sub == 0:
        b_ptr = b0_ptr
    elif sub == 1:
        b_ptr = b1_ptr
    else:
        b_ptr = b2_ptr
    n = first + tl.arange(0, BLOCK_N)
    r = tl.arange(0, BLOCK_R)
    todo = slots >= 0
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        cur = tl.min(tl.where(todo, slots, 2147483647), axis=0)
        sel = todo & (slots == cur)
        r_ok = r < tl.load(rank_ptr + cur.to(tl.int64) * n_sub + sub)
        sv = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for p in range(num_splits):
            sv += tl.load(s_ptr + p * stride_sp + rows[:, None] * stride_sm + sub * R + r[None, :],
                          mask=sel[:, None] & r_ok[None, :], other=0.0)
        bv = tl.load(b_ptr + cur.to(tl.int64) * n_out * R + n[None, :] * R + r[:, None],
                     mask=r_ok[:, None] & (n < n_out)[None, :], other=0.0)
        delta = tl.dot(sv.to(bv.dtype), bv, input_precision=PRECISION)
        y = y_ptr + rows[:, None] * stride_ym + y_off + n[None, :]
        y_ok = sel[:, None] & (n < n_out)[None, :]
        tl.store(y, (tl.load(y, mask=y_ok, other=0.0).to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=y_ok)
        todo = todo & (slots != cur)


# -- host wrappers ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the interpreter (tests): a few splits, cheap to run
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # ignored for 16-bit operands


def lora_shrink(x: torch.Tensor, a: torch.Tensor, token_slot: torch.Tensor, ranks: torch.Tensor, rank: int,
                rows: torch.Tensor | None = None, blocked: bool | None = None) -> torch.Tensor:
    """s = x @ A[slot]^T per token, all sub-modules at once; returns fp32 partial sums.

    x:          [T, in] bf16 / fp16 / fp32, unit column stride
    a:          [num_slots, n_sub * rank, in], contiguous (one layer of LoraManager.lora_a[module])
    token_slot: [>= T] int32, device: slot of token t, -1 = no adapter (skipped)
    ranks:      [num_slots, n_sub] int32, device: true rank per slot and sub-module (<= rank)
    rows:       optional [N] int: the tokens to process (e.g. LoRA tokens grouped by slot), default all T
    blocked:    force the schedule (tests); default by the number of rows (ROWWISE_MAX_ROWS)
    returns     s [splits, T, n_sub * rank] float32; rows of skipped tokens are left unwritten
    """
    T, K = x.shape
    R_total = a.shape[1]
    n_sub = R_total // rank
    N = T if rows is None else rows.shape[0]
    blocked = N > ROWWISE_MAX_ROWS if blocked is None else blocked
    block_k = 64 if blocked else ROWWISE_BLOCK_K
    block_r = _pow2(R_total, 16, 64)
    r_blocks = triton.cdiv(R_total, block_r)
    m_blocks = triton.cdiv(N, BLOCK_M) if blocked else N
    splits = max(1, min(MAX_SPLITS, triton.cdiv(K, block_k),
                        triton.cdiv(PROGRAMS_PER_SM * _num_sms(x.device), max(1, m_blocks * r_blocks))))
    k_per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    splits = triton.cdiv(K, k_per_split)
    s = torch.empty(splits, T, R_total, dtype=torch.float32, device=x.device)
    if N == 0:
        return s
    assert x.stride(1) == 1 and a.is_contiguous() and ranks.is_contiguous()
    rows_arg = token_slot if rows is None else rows  # never read without HAS_ROWS
    common = (x, a, token_slot, ranks, rows_arg, s)
    strides = (x.stride(0), a.stride(0), s.stride(0), s.stride(1))
    if blocked:
        _shrink_blocked[(m_blocks, splits, r_blocks)](
            *common, N, K, rank, R_total, n_sub, k_per_split, *strides, HAS_ROWS=rows is not None,
            BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_K=block_k, PRECISION=_precision(x.dtype))
    else:
        _shrink_rowwise[(m_blocks, splits, r_blocks)](
            *common, K, rank, R_total, n_sub, k_per_split, *strides, HAS_ROWS=rows is not None,
            BLOCK_R=block_r, BLOCK_K=block_k)
    return s


def lora_expand_add(s: torch.Tensor, b: tuple[torch.Tensor, ...], token_slot: torch.Tensor, ranks: torch.Tensor,
                    rank: int, y: torch.Tensor, out_offsets: tuple[int, ...], rows: torch.Tensor | None = None,
                    blocked: bool | None = None) -> torch.Tensor:
    """y[t, off_i:off_i+out_i] += s_i[t] @ B_i[slot]^T for every sub-module i, in one launch; returns y.

    s:           [splits, T, n_sub * rank] float32 from lora_shrink (partials are summed here)
    b:           1 to 3 stacks B_i [num_slots, out_i, rank], contiguous (one layer of LoraManager.lora_b)
    y:           [T, out_total] bf16 / fp16 / fp32, unit column stride; rows with slot -1 stay unchanged
    out_offsets: [n_sub + 1] column offsets of the sub-modules in y (LoraShapes.out_offsets)
    token_slot, ranks, rows, blocked: as in lora_shrink
    """
    splits, T, _ = s.shape
    N = T if rows is None else rows.shape[0]
    if N == 0:
        return y
    assert 1 <= len(b) <= 3 and y.stride(1) == 1 and all(t.is_contiguous() for t in b)
    blocked = N > ROWWISE_MAX_ROWS if blocked is None else blocked
    outs = [t.shape[1] for t in b] + [0] * (3 - len(b))
    offs = list(out_offsets[:len(b)]) + [0] * (3 - len(b))
    bs = list(b) + [b[0]] * (3 - len(b))
    block_r = _pow2(rank, 16, 128)
    block_n = 64 if blocked else _pow2(ROWWISE_TILE // block_r, 32, 512)
    n_blocks = sum(triton.cdiv(n, block_n) for n in outs)
    rows_arg = token_slot if rows is None else rows
    common = (s, *bs, token_slot, ranks, rows_arg, y)
    tail = (*outs, *offs, s.stride(0), s.stride(1), y.stride(0))
    if blocked:
        _expand_blocked[(triton.cdiv(N, BLOCK_M), n_blocks)](
            *common, N, rank, len(b), splits, *tail, HAS_ROWS=rows is not None, BLOCK_M=BLOCK_M,
            BLOCK_N=block_n, BLOCK_R=block_r, PRECISION=_precision(y.dtype))
    else:
        _expand_rowwise[(N, n_blocks)](
            *common, rank, len(b), splits, *tail, HAS_ROWS=rows is not None, BLOCK_N=block_n, BLOCK_R=block_r)
    return y
