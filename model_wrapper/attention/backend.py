"""The attention-backend interface: what a layer may ask of paged attention.

Per step the model wrapper calls `plan(batch)` once; each layer then writes this step's K/V
into the caller's cache through the backend's `kv_store` (attention/kv_store.KVStore, the one
K/V writer) and calls `run` (attention of the new tokens over their request's paged K/V). A
backend knows nothing of the model beyond head counts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from model_wrapper.attention.kv_store import KVStore
from model_wrapper.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    name = "abstract"
    supports_cuda_graphs = False  # implements the three CUDA-graph hooks below

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.kv_store = KVStore()  # the layers' K/V writer; ModelWrapper sets the one it built
        self.kv_cache_dtype: torch.dtype | None = None  # this step's cache dtype (None: the model's), set before plan

    @abstractmethod
    def plan(self, batch: ForwardBatch) -> None:
        """Build this step's attention metadata once; every layer's run() reuses it."""

    @abstractmethod
    def run(
        self,
        layer: int,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        window: int | None,
        batch: ForwardBatch,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, num_heads, head_dim] -> [T, num_heads, head_dim] in q's dtype.

        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], already holding this
        step's K/V. window: a token sees the last `window` keys (itself included), or all.
        k, v: this step's own K/V [T, num_kv_heads, head_dim] (what kv_store wrote; rows may be
        strided), which a backend may attend over directly where no request has K/V from before
        this step; None: read the caches.
        """

    def rope_attend(self, layer: int, qkv: torch.Tensor, kv, window: int | None, batch: ForwardBatch,
                    num_heads: int, num_kv_heads: int, qk_norm=None) -> torch.Tensor | None:
        """RoPE (Qwen3's q / k norms first: qk_norm (q weight, k weight, eps)), the K/V store and attention of a
        step in one go, from qkv [T, (num_heads + 2 num_kv_heads) * head_dim] as the projection wrote it (no LoRA
        delta or deferred norm pending) -> [T, num_heads, head_dim], or None where this backend does not take the
        step that way (the caller then runs kv_store.rope_write and run)."""
        return None

    # -- CUDA graphs of decode steps (model_wrapper/cuda_graph.py): one state per batch bucket ---------
    # A verify bucket holds q_per_req > 1 rows per request (request r's tokens at rows r * q_per_req ..,
    # its q_len first real, the rest padding); backends that have one say so in supports_verify_graphs.
    def init_cuda_graph_state(self, size: int, max_pages: int, kv_cache, config, q_per_req: int = 1):
        """-> the static buffers the attention of a graph bucket of `size` requests reads (each request
        at most max_pages pages of kv_cache; config: a KernelConfig; q_per_req rows per request),
        allocated before capture."""
        raise NotImplementedError(f"attention backend {self.name!r} has no CUDA-graph support")

    def supports_verify_graphs(self, kv_cache, config) -> bool:
        """Whether graph buckets of q_per_req > 1 rows per request (multi-token decode steps) can
        attend over kv_cache (causal chains, spec_mask trees and sliding windows)."""
        return False

    def init_forward_metadata_capture_cuda_graph(self, state, page: int) -> "AttentionBackend":
        """Before warm-up and capture: plan state for padding only (every request reads one page) and
        -> the backend the captured step runs (its run() reads only state's buffers; no plan)."""
        raise NotImplementedError(f"attention backend {self.name!r} has no CUDA-graph support")

    def init_forward_metadata_replay_cuda_graph(self, state, block_tables_cpu: torch.Tensor,
                                                seq_lens_cpu: torch.Tensor, page: int,
                                                q_lens_cpu: torch.Tensor | None = None,
                                                spec_mask: torch.Tensor | None = None,
                                                token_rows: torch.Tensor | None = None) -> None:
        """Before a replay, on the host only: fill state's metadata for the real requests
        (block_tables_cpu [B, max_blocks] int32, seq_lens_cpu [B]); the bucket's other rows are padding.
        A verify bucket also gets q_lens_cpu [B], token_rows [T] int64 (the bucket row of each of the
        step's T tokens) and spec_mask [T, max_q] bool (True = attend) or None (causal)."""
        raise NotImplementedError(f"attention backend {self.name!r} has no CUDA-graph support")
