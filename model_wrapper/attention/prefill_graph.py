"""The attention of mixed-step CUDA graphs: static metadata of one (token, request) bucket and the
backend a captured step runs (kernels/prefill_attention.py over that metadata).

The mixed-graph runner (model_wrapper/mixed_graph.py) builds one MixedGraphState per bucket before
capture, captures its step with MixedGraphAttention, and before each replay fills the state for the
step's requests (plan_mixed_replay, on the host only: pinned staging, then non-blocking copies).
The bucket's rows past the step's tokens are padding: tiles of request -1 (zero output); its
requests past the step's are padding too (no tile reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_wrapper.attention.backend import AttentionBackend


@dataclass
class MixedGraphState:
    """Static attention buffers of a mixed-graph bucket: int32, pinned host staging -> device (the
    device tensors are the ones the graph reads).

    tokens, requests: the bucket's packed rows and requests (padding included)
    block_t:          tokens per tile (prefill_attention.tile_tokens); n_tiles: the grid's tiles
    splits:           KV splits per (tile, KV head)
    meta_staging:     pinned [2 * (requests + 1) + requests + 3 * n_tiles]: qo_indptr [R + 1],
                      kv_indptr [R + 1], kv_last_page_len [R], tiles [3, n_tiles] (tile_map)
    meta:             the same on the device; qo_indptr / kv_indptr / kv_last / tiles are its views
    indices_staging:  pinned [>= requests * max_pages]; indices: the same on the device (kv_indices);
                      may be shared by every bucket of a runner (one replay's pages are live at a time)
    block_n:          keys a step of the kernel's loop
    """

    tokens: int
    requests: int
    block_t: int
    n_tiles: int
    splits: int
    meta_staging: torch.Tensor
    meta: torch.Tensor
    indices_staging: torch.Tensor
    indices: torch.Tensor
    block_n: int = 64
    host: tuple | None = None  # (qo, indptr, last) NumPy views of meta_staging, its tiles [3, n_tiles] view, indices

    def __post_init__(self):
        views = self.views(self.meta_staging)
        self.host = (*(t.numpy() for t in views[:3]), views[3], self.indices_staging.numpy())

    def views(self, t: torch.Tensor):
        """-> (qo_indptr, kv_indptr, kv_last, tiles [3, n_tiles]) of a meta-shaped tensor t."""
        R = self.requests
        qo, ind, last, tiles = t.split([R + 1, R + 1, R, 3 * self.n_tiles])
        return qo, ind, last, tiles.view(3, self.n_tiles)


def make_mixed_state(num_heads: int, num_kv_heads: int, tokens: int, requests: int, max_pages: int, device,
                     config, sms: int | None = None, pin: bool = True, indices=None) -> MixedGraphState:
    """A bucket's state on device; config: a KernelConfig (mixed_block_rows, mixed_block_n); sms:
    the GPU's SM count (None: ask the device) for the split rule. pin: pinned staging (False: plain
    host memory, for host-side tests). indices: (staging, device) page-index buffers of at least
    requests * max_pages entries to share, or None (the state's own)."""
    from model_wrapper.kernels.prefill_attention import max_tiles, prefill_splits, tile_tokens

    block_t = tile_tokens(num_heads, num_kv_heads, config.mixed_block_rows)
    n_tiles = max_tiles(tokens, requests, block_t)
    if sms is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    # a typical step of the bucket: its tokens in full tiles plus a partial tile for half its requests
    splits = prefill_splits(-(-tokens // block_t) + requests // 2, num_kv_heads, sms)
    n = 2 * (requests + 1) + requests + 3 * n_tiles
    meta_staging = torch.zeros(n, dtype=torch.int32)
    if indices is None:
        indices = (torch.zeros(requests * max_pages, dtype=torch.int32),
                   torch.zeros(requests * max_pages, dtype=torch.int32, device=device))
        if pin:
            indices = (indices[0].pin_memory(), indices[1])
    if pin:
        meta_staging = meta_staging.pin_memory()
    state = MixedGraphState(tokens, requests, block_t, n_tiles, splits, meta_staging,
                            torch.zeros(n, dtype=torch.int32, device=device), indices[0], indices[1],
                            block_n=config.mixed_block_n)
    plan_mixed_replay(state, None, None, None, 1)  # padding only: what warm-up and capture run
    return state


def plan_mixed_replay(state: MixedGraphState, q_lens_cpu, block_tables_cpu, seq_lens_cpu, page: int) -> None:
    """Fill state's metadata for B = len(q_lens_cpu) real requests (q_lens_cpu, seq_lens_cpu [B],
    block_tables_cpu [B, W] int32 host tensors, their tokens packed first), then copy it to the
    device (non-blocking, from pinned staging). None: no request (every row padding). The host
    arithmetic runs in NumPy on views of the staging: per-op cost of microseconds, not torch's."""
    from model_wrapper.kernels.prefill_attention import tile_map

    qo, indptr, last, tiles, indices_staging = state.host
    B = 0 if q_lens_cpu is None else q_lens_cpu.shape[0]
    n = 0
    qo[0] = indptr[0] = 0
    if B:
        L = seq_lens_cpu.numpy().astype(np.int64)
        pages = (L + page - 1) // page
        np.cumsum(q_lens_cpu.numpy(), out=qo[1:B + 1])
        np.cumsum(pages, out=indptr[1:B + 1])
        last[:B] = L - (pages - 1) * page
        tables = block_tables_cpu.numpy()
        indices = tables[np.arange(tables.shape[1])[None, :] < pages[:, None]]  # row-major: request order
        n = indices.shape[0]
        indices_staging[:n] = indices
    qo[B + 1:] = qo[B]  # padding requests: no tokens, no pages
    indptr[B + 1:] = indptr[B]
    last[B:] = 0
    tile_map(q_lens_cpu if B else torch.zeros(0, dtype=torch.int32), state.tokens, state.block_t,
             out=tiles)
    if n:
        state.indices[:n].copy_(state.indices_staging[:n], non_blocking=True)
    state.meta.copy_(state.meta_staging, non_blocking=True)


class MixedGraphAttention(AttentionBackend):
    """The attention a captured mixed step runs: the varlen paged kernel over the state's metadata
    (read on the device only); K/V is written by the backend's store, which skips padding's -1 slots."""

    name = "mixed-graph"

    def __init__(self, backend: AttentionBackend, state: MixedGraphState):
        super().__init__(backend.num_heads, backend.num_kv_heads, backend.head_dim, backend.scale)
        self.state = state
        self.kv_store = backend.kv_store
        self._views = state.views(state.meta)

    def plan(self, batch):  # planned by plan_mixed_replay, outside the graph
        pass

    def run(self, layer, q, k_cache, v_cache, window, batch, k=None, v=None):
        from model_wrapper.kernels.prefill_attention import paged_prefill_attention

        s = self.state
        qo, indptr, last, tiles = self._views
        ks, vs = self.kv_store.layer_scales(layer)  # read through their pointers (e4m3 caches only)
        return paged_prefill_attention(q if q.stride(-1) == 1 else q.contiguous(), k_cache, v_cache, qo, indptr,
                                       s.indices, last, tiles, batch.positions, self.scale, block_t=s.block_t,
                                       window=window, splits=s.splits, block_n=s.block_n, k_scale=ks, v_scale=vs)
