"""CUDA graphs for mixed and small prefill steps: the whole step captured per (token, request) bucket.

A step that the decode and verify graphs do not take (model_wrapper/cuda_graph.py routes it here):
any mix of requests with 1..T new tokens (prefill chunks after a cached prefix, plain prefills,
decodes), causal (no spec_mask or atten_mask), one logit row per request or fewer
(lm_head_indices given; None stays eager), at most KernelConfig.mixed_max_tokens tokens. It
replays the graph of the smallest token bucket >= T and request bucket >= max(B, num_out). Tokens
stay packed as forward_tensor takes them; the bucket's rows past T are padding (token 0, position
0, slot -1: written nowhere), its requests past B too (no tokens, no pages):

    step (packed):   | r0: a | r1: b c d e f g | r2: h |        q_lens = [1, 6, 1], T = 8
    bucket rows:     | a | b c d e f g | h | _ _ _ ... _ |      token bucket 32, request bucket 8
    lm_rows:         | 0 6 7 0 0 0 0 0 |   (the caller's lm_head_indices, then padding rows 0)

The logits of lm_rows[:num_out] come back. Attention is kernels/prefill_attention.py over the
bucket's static metadata (attention/prefill_graph.py: per-request ranges and pages, the tile map).

Per replay, on the host only: fill the pinned staging (ids, positions, slots, the attention's
metadata), copy it into the graph's static inputs, copy lm_head_indices (already on the device)
into lm_rows, replay. No host-device sync. The graphs carry the LoRA kernels as the decode graphs do (a
static per-token adapter slot buffer, -1: base model and padding, and the tokens grouped by slot, filled
per replay); KernelConfig(mixed_lora_graphs=False) sends steps that use adapters to the eager path.

The runner shares the decode runner's memory pool, cache identity and LoRA manager, and its rules
under tensor parallelism: whether a step replays, which bucket and when a capture happens depend
only on the call's arguments (token and request counts, lm_head_indices' length, masks, adapters,
cache identity) and on shared configuration, never on rank-local state. The token buckets include
BLAS_MAX_TOKENS (256): a bucket's steps all fall on one side of the wrapper's cuBLASLt switch,
the side its capture saw.
"""

from __future__ import annotations

import weakref

import torch
from loguru import logger

from adapters.lora_layers import LoraStep
from model_wrapper.attention.prefill_graph import MixedGraphAttention, make_mixed_state, plan_mixed_replay
from model_wrapper.forward_batch import ForwardBatch, ForwardMode

# token buckets: steps of 32 up to 512, 64 up to 1024, 128 up to 2048: a step of more than 256 tokens
# (compute-bound GEMMs: padding costs its share of the GPU time) pads at most 1/8 of its rows
DEFAULT_TOKEN_BUCKETS = tuple(range(32, 513, 32)) + tuple(range(576, 1025, 64)) + tuple(range(1152, 2049, 128))
# request buckets: they size the metadata and the logit rows only (lm_head reads its weight once
# whatever the rows up to a few dozen), so a few coarse ones keep the number of graphs down
DEFAULT_REQUEST_BUCKETS = (8, 32, 128, 256)


class _MixedBucket:
    """Static inputs, attention state and the captured graph of one (tokens, requests) bucket."""

    def __init__(self, tokens: int, requests: int, device, attn_state):
        self.tokens, self.requests = tokens, requests
        # token ids, positions, K/V slots [tokens] each, then the logit rows [requests]; one copy per replay
        self.inputs = torch.zeros(3 * tokens + requests, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slots = self.inputs[: 3 * tokens].view(3, tokens).unbind(0)
        self.lm_rows = self.inputs[3 * tokens:]
        self.staging = torch.zeros(3 * tokens + requests, dtype=torch.int64).pin_memory()
        self.token_slot = torch.full((tokens,), -1, dtype=torch.int32, device=device)  # LoRA slots
        self.token_slot_staging = torch.full((tokens,), -1, dtype=torch.int32).pin_memory()
        self.attn_state = attn_state
        self.graph = None
        self.logits = None


def bucket_at_least(buckets, n: int) -> int:
    return next(b for b in buckets if b >= n)


class MixedGraphRunner:
    """The mixed-step graphs of one DecodeGraphRunner (which owns this one and holds the memory pool,
    the cache key and the LoRA manager; held here by a weak proxy: no reference cycle)."""

    def __init__(self, parent, token_buckets=DEFAULT_TOKEN_BUCKETS, request_buckets=DEFAULT_REQUEST_BUCKETS):
        self.parent = weakref.proxy(parent)
        self.all_token_buckets = sorted(token_buckets)
        self.request_buckets = sorted({b for b in request_buckets if b < parent.max_batch} | {parent.max_batch})
        self._graphs: dict[tuple[int, int], _MixedBucket] = {}  # (tokens, requests) -> bucket
        self._fits = None  # (cache key, whether the kernel reads that cache)
        # every graph's logits end in this one buffer [request_buckets[-1], vocab] float32 (made at the
        # first capture), so that no graph keeps its own: the caller's rows are cloned before any replay
        self._out = None
        # page indices [request_buckets[-1] * max_pages] int32, pinned and on the device, shared by every
        # bucket; a staging buffer is refilled only once the last replay's copies ran (_copied)
        self._indices = None
        self._copied = None

    def reset(self) -> None:
        """Forget every captured graph (the owner dropped its pool or changed cache)."""
        self._graphs, self._indices = {}, None

    @property
    def token_buckets(self) -> list[int]:
        """The token buckets within the configuration's mixed_max_tokens."""
        top = self.parent.config.mixed_max_tokens
        return [t for t in self.all_token_buckets if t <= top]

    def bucket_for(self, tokens: int, requests: int) -> tuple[int, int]:
        """The captured (tokens, requests) a step of `tokens` packed tokens and `requests` requests (or
        logit rows, whichever is more) replays: a function of those and the configuration only."""
        return bucket_at_least(self.token_buckets, tokens), bucket_at_least(self.request_buckets, requests)

    def can_run(self, batch: ForwardBatch, kv_cache) -> bool:
        """Whether the step replays a mixed graph (the owner checked masks, hidden states and LoRA)."""
        if not self.parent.config.mixed_graphs or kv_cache is None or batch.lm_head_indices is None:
            return False
        if batch.spec_mask is not None or batch.atten_mask is not None:
            return False
        buckets = self.token_buckets
        rows = max(batch.batch_size, int(batch.lm_head_indices.shape[0]))
        if not buckets or batch.num_tokens > buckets[-1] or rows > self.request_buckets[-1]:
            return False
        return self._kernel_fits(kv_cache, batch.block_size)

    @torch.inference_mode()  # as ModelWrapper.forward, inside which a bucket met in a run is captured
    def capture(self, kv_cache, block_size: int, max_tokens: int | None = None, max_requests: int | None = None
                ) -> int:
        """Capture ahead of time every (token, request) bucket a step of at most max_tokens tokens and
        max_requests requests (None: any) replays, largest first, sharing the owner's memory pool; a
        bucket met for the first time in a run otherwise captures then (~0.1-0.2 s of host time in that
        step on an 8B model). Each with the cuBLAS front end the wrapper sets for steps of its size
        (ModelWrapper.forward: cuBLASLt up to BLAS_MAX_TOKENS tokens, a bucket boundary). -> how many
        buckets are captured now (0 where mixed graphs do not apply)."""
        from model_wrapper.model_wrapper import BLAS_MAX_TOKENS  # (that module imports this one)

        if not self.parent.config.mixed_graphs or not self._kernel_fits(kv_cache, block_size):
            return len(self._graphs)
        blas = self.parent.mw.blas
        self.parent._use_cache(kv_cache, block_size)
        top_t = self.token_buckets[-1] if max_tokens is None else bucket_at_least(self.token_buckets + [10**9],
                                                                                    max_tokens)
        top_r = self.request_buckets[-1] if max_requests is None else bucket_at_least(self.request_buckets + [10**9],
                                                                                      max_requests)
        # (t, r) is met by steps of B <= T <= t requests whose B falls in bucket r: r's lower neighbour < t
        below = dict(zip(self.request_buckets, [0] + self.request_buckets[:-1]))
        for size in sorted(((t, r) for t in self.token_buckets for r in self.request_buckets
                            if t <= top_t and r <= top_r and below[r] < t), reverse=True):
            if size in self._graphs:
                continue
            prev = torch.backends.cuda.preferred_blas_library()
            if blas is not None and size[0] <= BLAS_MAX_TOKENS:
                torch.backends.cuda.preferred_blas_library(blas)
            try:
                self._graphs[size] = self._capture(*size, kv_cache, block_size)
            finally:
                torch.backends.cuda.preferred_blas_library(prev)
        return len(self._graphs)

    def _kernel_fits(self, kv_cache, block_size: int) -> bool:
        key = self.parent._cache_key(kv_cache, block_size)
        if self._fits is None or self._fits[0] != key:
            from model_wrapper.kernels.prefill_attention import fits

            mw = self.parent.mw
            k = kv_cache[0][0]
            ok = fits(mw.dtype, k.dtype, k.shape[-1]) and all(c.is_contiguous() for pair in kv_cache for c in pair)
            self._fits = (key, ok)
        return self._fits[1]

    def _static_batch(self, bucket: _MixedBucket, block_size: int) -> ForwardBatch:
        """The batch a graph is captured with: its static buffers, one request holding every row."""
        T, R = bucket.tokens, bucket.requests
        q = torch.zeros(R, dtype=torch.int32)
        q[0] = T
        lora = self.parent.lora
        return ForwardBatch(
            mode=ForwardMode.MIXED, input_ids=bucket.input_ids, input_ids_cpu=None, positions=bucket.positions,
            positions_cpu=torch.zeros(T, dtype=torch.int64), slots=bucket.slots, slots_cpu=None,
            write_slots=bucket.slots, write_token_index=None, block_size=block_size, q_lens_cpu=q, seq_lens_cpu=q,
            qo_indptr_cpu=torch.cat((torch.zeros(1, dtype=torch.int32), torch.cumsum(q, 0).to(torch.int32))),
            block_tables_cpu=torch.zeros(R, 1, dtype=torch.int32), token_req=None, token_req_cpu=None,
            token_kv_index_cpu=None, lm_head_indices=bucket.lm_rows, spec_mask=None, atten_mask=None, max_q=T,
            max_kv=T, lora=None if lora is None else LoraStep(
                None, lora, lora.make_graph_batch(bucket.token_slot, bucket.lora_groups)))

    def _capture(self, tokens: int, requests: int, kv_cache, block_size: int) -> _MixedBucket:
        owner, mw = self.parent, self.parent.mw
        max_pages = -(-mw.cfg.max_position_embeddings // block_size)
        backend = mw.backend
        if self._indices is None:
            n = self.request_buckets[-1] * max_pages
            self._indices = (torch.zeros(n, dtype=torch.int32).pin_memory(),
                             torch.zeros(n, dtype=torch.int32, device=mw.device))
            self._copied = torch.cuda.Event()
        state = make_mixed_state(backend.num_heads, backend.num_kv_heads, tokens, requests, max_pages, mw.device,
                                 owner.config, indices=self._indices)
        bucket = _MixedBucket(tokens, requests, mw.device, state)
        if owner.lora is not None:  # the tokens grouped by adapter slot (LoraManager.groups_for)
            n = tokens + 1
            bucket.lora_groups = torch.zeros(owner.lora.max_loras + 1, n, dtype=torch.int32, device=mw.device)
            bucket.lora_groups_staging = torch.zeros(owner.lora.max_loras + 1, n, dtype=torch.int32).pin_memory()
        batch = self._static_batch(bucket, block_size)
        attn = MixedGraphAttention(backend, state)  # its state holds padding only until a replay fills it
        from model_wrapper.cuda_graph import warm_up  # (cuda_graph imports this module)

        warm_up(mw, batch, attn, kv_cache, bucket.slots)
        if self._out is None:
            self._out = torch.empty(self.request_buckets[-1], mw.cfg.vocab_size, dtype=torch.float32,
                                    device=mw.device)
        bucket.graph = torch.cuda.CUDAGraph()
        mode = "thread_local" if mw.tp.enabled else "global"
        with torch.cuda.graph(bucket.graph, pool=owner._pool, capture_error_mode=mode):
            # the graph's own logits go back to the pool once captured: later captures may reuse them
            self._out[:requests].copy_(mw.model(batch, kv_cache, attn, mw.kernels))
        bucket.logits = self._out[:requests]
        owner._pool = bucket.graph.pool()
        logger.info("captured a mixed-step CUDA graph for (tokens, requests) ({}, {})", tokens, requests)
        return bucket

    def run(self, batch: ForwardBatch, kv_cache) -> torch.Tensor:
        """-> float32 logits [num_out, vocab] of the step (can_run holds)."""
        T, B = batch.num_tokens, batch.batch_size
        n_out = int(batch.lm_head_indices.shape[0])
        size = self.bucket_for(T, max(B, n_out))
        self.parent._use_cache(kv_cache, batch.block_size)
        bucket = self._graphs.get(size)
        if bucket is None:
            bucket = self._graphs[size] = self._capture(*size, kv_cache, batch.block_size)
        Tb = bucket.tokens
        st = bucket.staging
        self._copied.synchronize()
        st[: 2 * Tb].zero_()
        st[2 * Tb: 3 * Tb].fill_(-1)
        st[3 * Tb:].zero_()
        st[:T] = batch.input_ids_cpu
        st[Tb: Tb + T] = batch.positions_cpu
        st[2 * Tb: 2 * Tb + T] = batch.slots_cpu
        plan_mixed_replay(bucket.attn_state, batch.q_lens_cpu, batch.block_tables_cpu, batch.seq_lens_cpu,
                          batch.block_size)
        bucket.inputs.copy_(st, non_blocking=True)
        bucket.lm_rows[:n_out].copy_(batch.lm_head_indices)  # on the device already
        if self.parent.lora is not None:
            self._fill_lora(bucket, batch)
        if batch.prev_token_ids is not None:  # ids still on the device (an engine running ahead)
            tokens, rows, index = batch.prev_token_ids  # rows: packed token indices = bucket rows
            bucket.input_ids.index_copy_(0, rows, tokens.index_select(0, index))
        self._copied.record()
        bucket.graph.replay()
        return bucket.logits[:n_out].clone()  # the shared output is overwritten by the next replay

    def _fill_lora(self, bucket: _MixedBucket, batch: ForwardBatch) -> None:
        """Each token's adapter slot (-1: base model, padding) and the tokens grouped by slot, into
        the bucket's staging buffers, then onto the device."""
        lora = self.parent.lora
        ids = None if batch.lora is None else batch.lora.adapter_ids
        bucket.token_slot_staging.fill_(-1)
        if ids is not None:
            slots = torch.tensor(lora.slots_for(ids), dtype=torch.int32)
            T = batch.num_tokens
            bucket.token_slot_staging[:T] = slots.expand(T) if slots.numel() == 1 else slots[batch.token_req_cpu]
        bucket.token_slot.copy_(bucket.token_slot_staging, non_blocking=True)
        lora.groups_for(bucket.token_slot_staging, out=bucket.lora_groups_staging)
        bucket.lora_groups.copy_(bucket.lora_groups_staging, non_blocking=True)
