"""moe_align: token-expert pairs grouped by expert and padded to whole blocks, on the device, no host sync.

    ids [T, k] -> pairs [R] int32: the pair indices p = t * k + j grouped by expert in ascending expert
                  order, ascending p within an expert, each expert's run padded to a multiple of
                  BLOCK_M with the sentinel P = T * k
                  block_expert [R / BLOCK_M] int32: the expert of rows [b * BLOCK_M, (b + 1) * BLOCK_M),
                  or E past the last run
    R = P + min(E, P) * (BLOCK_M - 1) rounded up to BLOCK_M: the worst case, so that every size is a
    function of T alone and a CUDA graph replays whatever the routing.

Two implementations with one result: moe_align_reference (torch's scatter / sort / cumsum / searchsorted,
about eight small kernels) and moe_align (two Triton kernels over chunks of CHUNK pairs):

    count   program c: counts[c, e] = pairs of chunk c routed to e          (and fills pairs with P)
    scatter program c: total[e] = sum_c counts[c, e], before[e] = sum_{c' < c} counts[c', e]
                       start[e] = exclusive cumsum of total rounded up to BLOCK_M
                       pairs[start[e] + before[e] + rank] = p, rank = earlier pairs of chunk c with e
                       block_expert[b] = #{e < E : end[e] <= b * BLOCK_M} for its share of the blocks
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, launch_args


def align_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """R, the rows of `pairs`: every pair plus the worst-case padding, a whole number of blocks."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


def moe_align_reference(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] int -> (pairs [R] int32, block_expert [R // block_m] int32) with torch ops (no sync)."""
    T, k = ids.shape
    P = T * k
    flat = ids.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.sort(flat, stable=True).indices  # pairs by expert, p ascending within one
    sorted_e = flat[order]
    rank = torch.arange(P, device=ids.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    rows = align_rows(P, num_experts, block_m)
    pairs = torch.full((rows,), P, dtype=torch.int32, device=ids.device)
    pairs[(ends - padded)[sorted_e] + rank] = order.to(torch.int32)
    starts = torch.arange(0, rows, block_m, device=ids.device)
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return pairs, block_expert


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, pairs_ptr, P, rows, FILL, EP: tl.constexpr, CHUNK: tl.constexpr,
                  PDL: tl.constexpr):
    c = tl.program_id(0)
    if PDL:
        gdc_wait()  # the routing is complete
        gdc_launch_dependents()
    offs = c * CHUNK + tl.arange(0, CHUNK)
    e = tl.load(ids_ptr + offs, mask=offs < P, other=EP)  # EP matches no column: a pair past P counts nowhere
    cols = tl.arange(0, EP)
    counts = tl.sum((e[:, None] == cols[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + c * EP + cols, counts)
    # this program's share of the sentinel fill; the scatter kernel, launched after, overwrites the real rows
    for r0 in range(0, FILL, CHUNK):
        r = c * FILL + r0 + tl.arange(0, CHUNK)
        tl.store(pairs_ptr + r, tl.full((CHUNK,), 0, tl.int32) + P, mask=r < rows)


@triton.jit
def _scatter_kernel(ids_ptr, counts_ptr, pairs_ptr, block_expert_ptr, P, E, num_chunks, num_blocks, BLOCKS_PER,
                    EP: tl.constexpr, CHUNK: tl.constexpr, CHUNK_TILE: tl.constexpr, BLOCK_TILE: tl.constexpr,
                    BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    c = tl.program_id(0)
    if PDL:
        gdc_wait()  # the count kernel is complete
        gdc_launch_dependents()
    cols = tl.arange(0, EP)
    total = tl.zeros((EP,), dtype=tl.int32)
    before = tl.zeros((EP,), dtype=tl.int32)
    for c0 in range(0, num_chunks, CHUNK_TILE):
        ch = c0 + tl.arange(0, CHUNK_TILE)
        tile = tl.load(counts_ptr + ch[:, None] * EP + cols[None, :], mask=(ch < num_chunks)[:, None], other=0)
        total += tl.sum(tile, axis=0)
        before += tl.sum(tl.where((ch < c)[:, None], tile, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    base = ends - padded + before  # where chunk c's first pair of each expert goes
    # chunk c's pairs: base of its expert + its rank among the chunk's earlier pairs of that expert
    i = tl.arange(0, CHUNK)
    offs = c * CHUNK + i
    valid = offs < P
    e = tl.load(ids_ptr + offs, mask=valid, other=EP)
    rank = tl.sum(((e[:, None] == e[None, :]) & (i[None, :] < i[:, None])).to(tl.int32), axis=1)
    dest = tl.sum(tl.where(e[:, None] == cols[None, :], base[None, :], 0), axis=1) + rank
    tl.store(pairs_ptr + dest, offs.to(tl.int32), mask=valid)
    # block b's expert: the number of experts whose padded run ends at or before the block's first row
    for b0 in range(0, BLOCKS_PER, BLOCK_TILE):
        b = c * BLOCKS_PER + b0 + tl.arange(0, BLOCK_TILE)
        done = (ends[None, :] <= (b * BLOCK_M)[:, None]) & (cols < E)[None, :]
        tl.store(block_expert_ptr + b, tl.sum(done.to(tl.int32), axis=1), mask=b < num_blocks)


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int, chunk: int = 128,
              pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] int -> (pairs [R] int32, block_expert [R // block_m] int32): moe_align_reference's result
    from two Triton kernels (chunk pairs a program; a power of two), nothing read back to the host; pdl:
    launched with programmatic dependent launch (sm90+), each waiting for the kernel before at entry."""
    T, k = ids.shape
    P = T * k
    ids = ids.contiguous()
    rows = align_rows(P, num_experts, block_m)
    num_blocks = rows // block_m
    num_chunks = triton.cdiv(P, chunk)
    ep = triton.next_power_of_2(num_experts)
    fill = triton.cdiv(triton.cdiv(rows, num_chunks), chunk) * chunk
    counts = torch.empty(num_chunks, ep, dtype=torch.int32, device=ids.device)
    pairs = torch.empty(rows, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=ids.device)
    _count_kernel[(num_chunks,)](ids, counts, pairs, P, rows, fill, EP=ep, CHUNK=chunk, PDL=pdl, **launch_args(pdl))
    _scatter_kernel[(num_chunks,)](ids, counts, pairs, block_expert, P, num_experts, num_chunks, num_blocks,
                                   triton.cdiv(num_blocks, num_chunks), EP=ep, CHUNK=chunk,
                                   CHUNK_TILE=min(32, max(2, triton.next_power_of_2(num_chunks))), BLOCK_TILE=64,
                                   BLOCK_M=block_m, PDL=pdl, **launch_args(pdl))
    return pairs, block_expert
