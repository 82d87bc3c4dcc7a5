"""The FlashInfer backend's decode attention inside CUDA graphs: per bucket, static page metadata
and the attention a captured step runs.

The graph runner (model_wrapper/cuda_graph.py) sees only the backend's three hooks
(AttentionBackend.init_cuda_graph_state / init_forward_metadata_capture_cuda_graph /
init_forward_metadata_replay_cuda_graph); this module is what they build for FlashInfer:

    DecodeGraphState   one bucket's static buffers: page indices (and, for the Triton kernels,
                       kv_indptr + kv_last_page_len; for verify buckets also q_lens and the mask
                       bits), or FlashInfer's graph wrappers (one per window)
    GraphAttention     the backend a captured step runs: the Triton decode kernel
                       (kernels/decode_attention.py) over the state's metadata where it fits, else
                       the state's planned FlashInfer wrappers; in a verify bucket (q_per_req > 1
                       rows per request, the fixed-stride layout) the Triton verify kernel
                       (kernels/verify_attention.py)

Per replay, on the host only: the bucket's page metadata goes into pinned staging buffers, then
one non-blocking copy to the device (the Triton kernels'), or FlashInfer's plan into its wrappers'
fixed buffers. Padding requests read one page (the first page of request 0); in a verify bucket
they have q_len 0, and a real request's rows past its q_len are padding too (zero output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model_wrapper.attention.backend import AttentionBackend


@dataclass
class DecodeGraphState:
    """Static attention buffers of one decode-graph bucket of `size` requests (int32, pinned host
    staging -> device; the device tensors are the ones the graph reads).

    size:            requests in the bucket (padding included)
    triton:          whether the graph runs a Triton kernel (else FlashInfer's wrappers)
    q_per_req:       rows per request: 1 (decode), or 2..16 (verify: the Triton verify kernel)
    indices_staging: [size * max_pages] pinned; indices: the same on the device (kv_indices)
    meta_staging:    pinned (Triton): kv_indptr [size + 1], kv_last_page_len [size], and in a
                     verify bucket q_lens [size] and mask bits [size * q_per_req] (verify_attention)
    meta:            the same on the device; kv_indptr / kv_last / q_lens / bits are its views
    splits:          KV splits per (request, KV head) of the Triton kernel
    launch:          the Triton decode kernel's launch keywords beside LAUNCH's (decode_attention.decode_plan)
    wrappers:        FlashInfer's BatchDecodeWithPagedKVCacheWrapper per window (use_cuda_graph)
    split_kv:        whether FlashInfer's plan may split the KV of a request (not: disable_split_kv)
    kv_dtype:        the caches' dtype (the model's, or float8_e4m3fn: K/V scaled per layer)
    """

    size: int
    triton: bool
    indices_staging: torch.Tensor
    indices: torch.Tensor
    q_per_req: int = 1
    meta_staging: torch.Tensor | None = None
    meta: torch.Tensor | None = None
    kv_indptr: torch.Tensor | None = None
    kv_last: torch.Tensor | None = None
    q_lens: torch.Tensor | None = None
    bits: torch.Tensor | None = None
    splits: int = 1
    launch: dict = field(default_factory=dict)
    wrappers: dict = field(default_factory=dict)
    split_kv: bool = True
    kv_dtype: torch.dtype | None = None


def make_state(backend, size: int, max_pages: int, windows, triton: bool, unsplit_kv: bool,
               q_per_req: int = 1, kv_dtype: torch.dtype | None = None) -> DecodeGraphState:
    """A bucket's DecodeGraphState on backend.device (a FlashInferAttentionBackend); q_per_req > 1
    (a verify bucket) needs triton; kv_dtype: the caches' (None: the model's)."""
    device = backend.device
    # page indices travel pinned -> device ourselves: FlashInfer's plan copies host indices
    # with a blocking copy, device ones without
    state = DecodeGraphState(size, triton, torch.zeros(size * max_pages, dtype=torch.int32).pin_memory(),
                             torch.zeros(size * max_pages, dtype=torch.int32, device=device), q_per_req=q_per_req,
                             kv_dtype=kv_dtype if kv_dtype is not None else backend.kv_dtype)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if triton:  # the kernels' metadata: kv_indptr [size + 1], kv_last_page_len [size] (+ q_lens, bits)
        from model_wrapper.kernels.common import sm90
        from model_wrapper.kernels.decode_attention import cuda_e4m3, decode_plan

        n = 2 * size + 1 + (size + size * q_per_req if q_per_req > 1 else 0)
        state.meta = torch.zeros(n, dtype=torch.int32, device=device)
        state.meta_staging = torch.zeros(n, dtype=torch.int32).pin_memory()
        state.kv_indptr, state.kv_last = state.meta[: size + 1], state.meta[size + 1: 2 * size + 1]
        if q_per_req > 1:
            state.q_lens = state.meta[2 * size + 1: 3 * size + 1]
            state.bits = state.meta[3 * size + 1:]
        # a verify program reads the same keys as a decode one (for q_per_req tokens at once)
        cfg = backend.kv_store.config
        state.splits, state.launch = decode_plan(
            size, backend.num_kv_heads, sms, state.kv_dtype if q_per_req == 1 else None,
            cuda=q_per_req == 1 and cuda_e4m3(cfg, size),
            fat=q_per_req == 1 and cfg.decode_attention_fat and sm90(device))  # (measured on Hopper only)
        return state
    if q_per_req > 1:
        raise ValueError(f"q_per_req: a verify bucket ({q_per_req} rows per request) runs the Triton kernel only")
    import flashinfer

    # FlashInfer splits each request's KV over several programs (then merges) unless told not
    # to; with a program per (request, KV head) already filling the SMs the split only costs
    # (faster at large batches, slower at small ones: hence the rule). Unsplit replays are also
    # deterministic.
    state.split_kv = not unsplit_kv or size * backend.num_kv_heads < sms
    for w in windows:
        state.wrappers[w] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            backend.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=backend.tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(size + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buffer=torch.zeros(size * max_pages, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buffer=torch.zeros(size, dtype=torch.int32, device=device),
        )
    return state


def plan_replay(backend, state: DecodeGraphState, block_tables_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor,
                page: int, q_lens_cpu: torch.Tensor | None = None, spec_mask: torch.Tensor | None = None,
                token_rows: torch.Tensor | None = None) -> None:
    """Fill state's metadata for B = len(seq_lens_cpu) real requests (block_tables_cpu [B, W] int32,
    seq_lens_cpu [B]); the size - B padding requests read one page (request 0's first) each.
    A verify bucket also takes q_lens_cpu [B], token_rows [T] int64 (the bucket row of each of the
    step's T tokens) and spec_mask [T, <= 16] bool or None (chains: causal)."""
    from model_wrapper.attention.flashinfer_backend import page_metadata

    B, b = seq_lens_cpu.shape[0], state.size
    tables = torch.full((b, block_tables_cpu.shape[1]), -1, dtype=torch.int32)
    tables[:B] = block_tables_cpu
    tables[B:, 0] = block_tables_cpu[0, 0]
    lens = torch.ones(b, dtype=torch.int32)
    lens[:B] = seq_lens_cpu
    indptr, indices, last = page_metadata(tables, lens, page, pin=not state.triton)
    n = indices.numel()
    state.indices_staging[:n] = indices
    state.indices[:n].copy_(state.indices_staging[:n], non_blocking=True)
    if state.triton:
        state.meta_staging[: b + 1] = indptr
        state.meta_staging[b + 1: 2 * b + 1] = last
        if state.q_per_req > 1:
            _verify_metadata(state, q_lens_cpu, spec_mask, token_rows)
        state.meta.copy_(state.meta_staging, non_blocking=True)
        return
    for w, wrapper in state.wrappers.items():
        wrapper.plan(indptr, state.indices[:n], last, backend.num_heads, backend.num_kv_heads, backend.head_dim, page,
                     window_left=-1 if w is None else w - 1, q_data_type=backend.kv_dtype, kv_data_type=state.kv_dtype,
                     sm_scale=backend.scale, disable_split_kv=not state.split_kv)


def _verify_metadata(state: DecodeGraphState, q_lens_cpu, spec_mask, token_rows) -> None:
    """q_lens (0 for padding requests) and the mask bits of every row into state's staging."""
    from model_wrapper.kernels.verify_attention import causal_bits, mask_bits

    b, Q = state.size, state.q_per_req
    q_lens = state.meta_staging[2 * b + 1: 3 * b + 1]
    bits = state.meta_staging[3 * b + 1:]
    q_lens.zero_()
    bits.zero_()  # padding rows see nothing
    if q_lens_cpu is None:  # the capture's plan: padding only
        return
    q_lens[: q_lens_cpu.shape[0]] = q_lens_cpu
    if spec_mask is not None:
        bits[token_rows] = mask_bits(spec_mask)
    else:  # a chain: row i of every request sees new tokens 0..i (rows past q_len are never read)
        bits[: q_lens_cpu.shape[0] * Q] = causal_bits(Q).repeat(q_lens_cpu.shape[0])


class GraphAttention(AttentionBackend):
    """The attention a captured step runs: the Triton decode kernel over the state's metadata, or
    the state's planned FlashInfer wrappers; nothing else. K/V is written by the backend's store."""

    name = "flashinfer-graph"

    def __init__(self, backend, state: DecodeGraphState):
        super().__init__(backend.num_heads, backend.num_kv_heads, backend.head_dim, backend.scale)
        self.state = state
        self.kv_store = backend.kv_store  # skips the -1 slots of padding (KVStore.graph_safe)

    def plan(self, batch):  # planned by the replay hook, outside the graph
        pass

    quantizes_output = True  # run(quant_group=...): the Triton decode kernel's split merge may quantize o's input

    def run(self, layer, q, k_cache, v_cache, window, batch, k=None, v=None, quant_group=None):
        """As AttentionBackend.run; quant_group (the o projection's attention_input_quant): where the step runs the
        Triton decode kernel with splits, a QuantizedActivation of [T, num_heads * head_dim] instead."""
        s = self.state
        if s.q_per_req > 1:
            from model_wrapper.kernels.verify_attention import paged_verify_attention

            return paged_verify_attention(q if q.stride(-1) == 1 else q.contiguous(), k_cache, v_cache, s.kv_indptr,
                                          s.indices, s.kv_last, s.q_lens, s.bits, batch.positions, self.scale,
                                          q_per_req=s.q_per_req, window=window, splits=s.splits)
        if s.triton:
            from model_wrapper.kernels.common import uses_pdl
            from model_wrapper.kernels.decode_attention import cuda_e4m3, paged_decode_attention

            ks, vs = self.kv_store.layer_scales(layer)  # read through their pointers by the kernel
            cfg = self.kv_store.config
            return paged_decode_attention(q if q.stride(-1) == 1 else q.contiguous(), k_cache, v_cache, s.kv_indptr,
                                          s.indices, s.kv_last, self.scale, window=window, splits=s.splits,
                                          k_scale=ks, v_scale=vs, prefetch=cfg.decode_attention_prefetch,
                                          pdl=q.shape[0] <= cfg.decode_attention_pdl_max_batch
                                          and uses_pdl(q.device, cfg), cuda=cuda_e4m3(cfg, q.shape[0]),
                                          quant_group=quant_group, **s.launch)
        return s.wrappers[window].run(q, (k_cache, v_cache), **fp8_scales(self.kv_store, layer, k_cache.dtype))

    def rope_attend(self, layer, qkv, kv, window, batch, num_heads, num_kv_heads, qk_norm=None):
        """One kernel for RoPE, the store and the decode attention (decode_attention.rope_decode_attention) in a
        decode bucket of at least KernelConfig.decode_rope_attention_min_batch rows that runs the Triton decode kernel
        (not the e4m3 CUDA one), where the K/V store would take the step fused (KVStore.fuses_rope); else None."""
        from model_wrapper.kernels.common import uses_pdl
        from model_wrapper.kernels.decode_attention import cuda_e4m3, rope_decode_attention

        s, cfg, B = self.state, self.kv_store.config, qkv.shape[0]
        store = self.kv_store
        if (s.q_per_req > 1 or not s.triton or B < cfg.decode_rope_attention_min_batch
                or (kv[0].dtype == torch.float8_e4m3fn and cuda_e4m3(cfg, B))
                or not store.fuses_rope(B, kv[0].dtype, qkv.dtype, qk_norm=qk_norm is not None)):
            return None
        ks, vs = store.layer_scales(layer)
        return rope_decode_attention(qkv, batch.positions, store.rope_table, batch.slots, num_heads, num_kv_heads,
                                     kv[0], kv[1], s.kv_indptr, s.indices, s.kv_last, self.scale, qk_norm=qk_norm,
                                     window=window, splits=s.splits, k_scale=ks, v_scale=vs,
                                     prefetch=cfg.decode_attention_prefetch,
                                     pdl=B <= cfg.decode_attention_pdl_max_batch and uses_pdl(qkv.device, cfg),
                                     **s.launch)


def fp8_scales(kv_store, layer: int, kv_dtype: torch.dtype) -> dict:
    """FlashInfer run()'s k_scale / v_scale of an e4m3 cache (host floats: the K scale is folded into
    sm_scale, the V scale multiplies the output), {} otherwise. A graph keeps the values of its
    capture: ModelWrapper.set_kv_scales drops the graphs."""
    if kv_dtype != torch.float8_e4m3fn:
        return {}
    return {"k_scale": float(kv_store.scales_host[0, layer]), "v_scale": float(kv_store.scales_host[1, layer])}
