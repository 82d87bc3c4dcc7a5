"""CUDA graphs for decode steps: the whole step (embedding to logits) captured per batch bucket.

A decode step with one token per request, no masks and no LoRA, whose batch fits the largest
bucket, replays a graph captured for the smallest bucket >= batch. Per replay, on the host only:
fill pinned staging buffers (token ids, positions, write slots, page metadata), plan the bucket's
FlashInfer decode wrapper (it copies its indptrs into its fixed buffers), copy the staging
buffers into the graph's static inputs, replay. No host-device sync.

Batch sizes up to 32 get a graph of their own (no padding: K/V rows go straight to their
slots); larger ones replay the next multiple of 8 and pad, without writing anywhere the caller
did not name: rows B..b-1 (and real rows with slot -1) write the K/V of the first written row to
that row's own slot, duplicate writes of identical bytes whose order does not matter; padding
requests read one page (the first page of request 0) and their logits are dropped. A batch with
a -1 slot and an exact-size graph runs eagerly.
Graphs capture the caller's kv_cache tensors by address: a different cache (or block size)
drops the graphs and captures again. Warm-up runs write only into a scratch cache.
"""

from __future__ import annotations

import torch
from loguru import logger

from model_wrapper.attention.backend import AttentionBackend
from model_wrapper.forward_batch import ForwardBatch, ForwardMode

EXACT_UP_TO = 32
DEFAULT_BUCKETS = tuple(range(1, EXACT_UP_TO + 1)) + tuple(range(EXACT_UP_TO + 8, 257, 8))


class _Bucket:
    """Static buffers, FlashInfer graph wrappers and the captured graph of one batch size."""

    def __init__(self, size: int, max_pages: int, device, windows, backend, tc: bool):
        import flashinfer

        self.size = size
        self.padded = size > EXACT_UP_TO  # exact-size graphs write rows directly
        # static inputs: token ids, positions, write slots, write source rows; one copy per replay
        self.inputs = torch.zeros(4, size, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.write_slots, self.write_src = self.inputs.unbind(0)
        self.staging = torch.zeros(4, size, dtype=torch.int64).pin_memory()
        # page indices travel pinned -> device ourselves: FlashInfer's plan copies host indices
        # with a blocking copy, device ones without
        self.indices_staging = torch.zeros(size * max_pages, dtype=torch.int32).pin_memory()
        self.indices = torch.zeros(size * max_pages, dtype=torch.int32, device=device)
        self.copied = torch.cuda.Event()  # staging may be refilled once its last copy is done
        self.wrappers = {}
        for w in windows:
            self.wrappers[w] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                backend.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tc,
                paged_kv_indptr_buffer=torch.zeros(size + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(size * max_pages, dtype=torch.int32, device=device),
                paged_kv_last_page_len_buffer=torch.zeros(size, dtype=torch.int32, device=device),
            )
        self.graph = None
        self.logits = None


class _GraphAttention(AttentionBackend):
    """The attention a captured step runs: the bucket's planned wrappers, nothing else."""

    name = "flashinfer-graph"

    def __init__(self, backend, bucket: _Bucket):
        super().__init__(backend.num_heads, backend.num_kv_heads, backend.head_dim, backend.scale)
        self.bucket = bucket

    def plan(self, batch):  # planned by DecodeGraphRunner outside the graph
        pass

    def run(self, layer, q, k_cache, v_cache, window, batch):
        return self.bucket.wrappers[window].run(q, (k_cache, v_cache))


class DecodeGraphRunner:
    def __init__(self, wrapper, *, max_batch: int = 128, buckets=DEFAULT_BUCKETS):
        self.mw = wrapper
        self.buckets = sorted(b for b in buckets if b <= max_batch) or [max_batch]
        self.max_batch = self.buckets[-1]
        self.windows = [None] + list(wrapper.backend.windows)
        self._graphs: dict[int, _Bucket] = {}
        self._key = None
        self._pool = None

    def can_run(self, batch: ForwardBatch) -> bool:
        B = batch.batch_size
        return (batch.mode == ForwardMode.DECODE and batch.max_q == 1 and batch.spec_mask is None
                and batch.atten_mask is None and batch.lora is None and B <= self.max_batch
                and batch.write_slots.numel() > 0
                and (B > EXACT_UP_TO or batch.write_token_index is None))

    def _cache_key(self, kv_cache, block_size):
        return (len(kv_cache), kv_cache[0][0].data_ptr(), kv_cache[-1][1].data_ptr(),
                tuple(kv_cache[0][0].shape), block_size)

    def _plan(self, bucket: _Bucket, block_tables_cpu, seq_lens_cpu, page):
        from model_wrapper.attention.flashinfer_backend import page_metadata

        B, b = seq_lens_cpu.shape[0], bucket.size
        tables = torch.full((b, block_tables_cpu.shape[1]), -1, dtype=torch.int32)
        tables[:B] = block_tables_cpu
        tables[B:, 0] = block_tables_cpu[0, 0]
        lens = torch.ones(b, dtype=torch.int32)
        lens[:B] = seq_lens_cpu
        indptr, indices, last = page_metadata(tables, lens, page)
        n = indices.numel()
        bucket.indices_staging[:n] = indices
        bucket.indices[:n].copy_(bucket.indices_staging[:n], non_blocking=True)
        be = self.mw.backend
        for w, wrapper in bucket.wrappers.items():
            wrapper.plan(indptr, bucket.indices[:n], last, be.num_heads, be.num_kv_heads, be.head_dim, page,
                         window_left=-1 if w is None else w - 1, q_data_type=self.mw.dtype,
                         kv_data_type=self.mw.dtype, sm_scale=be.scale)

    def _static_batch(self, bucket: _Bucket, block_size: int) -> ForwardBatch:
        one = torch.ones(bucket.size, dtype=torch.int32)
        return ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=bucket.input_ids, input_ids_cpu=None, positions=bucket.positions,
            positions_cpu=torch.zeros(bucket.size, dtype=torch.int64), slots=bucket.write_slots, slots_cpu=None,
            write_slots=bucket.write_slots, write_token_index=bucket.write_src if bucket.padded else None,
            block_size=block_size,
            q_lens_cpu=one, seq_lens_cpu=one, qo_indptr_cpu=torch.arange(bucket.size + 1, dtype=torch.int32),
            block_tables_cpu=torch.zeros(bucket.size, 1, dtype=torch.int32), block_tables=None,
            token_req=None, token_kv_index=None, lm_head_indices=None, spec_mask=None, atten_mask=None,
            max_q=1, max_kv=1)

    def _capture(self, size: int, kv_cache, block_size: int) -> _Bucket:
        mw = self.mw
        max_pages = -(-mw.cfg.max_position_embeddings // block_size)
        bucket = _Bucket(size, max_pages, mw.device, self.windows, mw.backend, mw.backend.tensor_cores)
        batch = self._static_batch(bucket, block_size)
        attn = _GraphAttention(mw.backend, bucket)
        # plan: every padding request reads page 0 of the scratch cache during warm-up
        self._plan(bucket, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), block_size)
        scratch = [(torch.zeros_like(k[:1]), torch.zeros_like(v[:1])) for k, v in kv_cache]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                mw.model(batch, scratch, attn, mw.kernels)
        torch.cuda.current_stream().wait_stream(stream)
        bucket.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(bucket.graph, pool=self._pool):
            bucket.logits = mw.model(batch, kv_cache, attn, mw.kernels)
        self._pool = bucket.graph.pool()
        return bucket

    def capture(self, kv_cache, block_size: int, sizes=None) -> None:
        """Capture the buckets ahead of time (largest first, sharing one memory pool)."""
        key = self._cache_key(kv_cache, block_size)
        if key != self._key:
            self._graphs, self._key, self._pool = {}, key, None
        for size in sorted(sizes or self.buckets, reverse=True):
            if size not in self._graphs:
                self._graphs[size] = self._capture(size, kv_cache, block_size)
        logger.info("captured decode CUDA graphs for batch sizes {}", sorted(self._graphs))

    def run(self, batch: ForwardBatch, kv_cache) -> torch.Tensor:
        B = batch.batch_size
        size = next(s for s in self.buckets if s >= B)
        key = self._cache_key(kv_cache, batch.block_size)
        if key != self._key or size not in self._graphs:
            self.capture(kv_cache, batch.block_size, [size])
        bucket = self._graphs[size]
        st = bucket.staging
        bucket.copied.synchronize()
        slots = batch.slots_cpu
        written = slots >= 0
        first = int(torch.nonzero(written)[0, 0])
        st.zero_()
        st[0, :B] = batch.input_ids_cpu
        st[1, :B] = batch.positions_cpu
        st[2] = slots[first]
        st[2, :B] = torch.where(written, slots, slots[first])
        st[3] = first
        st[3, :B] = torch.where(written, torch.arange(B), first)
        self._plan(bucket, batch.block_tables_cpu, batch.seq_lens_cpu, batch.block_size)
        bucket.inputs.copy_(st, non_blocking=True)
        bucket.copied.record()
        bucket.graph.replay()
        if batch.lm_head_indices is not None:
            return bucket.logits.index_select(0, batch.lm_head_indices)
        return bucket.logits[:B].clone()  # the static output is overwritten by the next replay
