"""CUDA graphs for decode steps: the whole step (embedding to logits) captured per batch bucket.

A decode step with one token per request, no masks and no LoRA, whose batch fits the largest
bucket, replays a graph captured for the smallest bucket >= batch. Per replay, on the host only:
fill pinned staging buffers (token ids, positions, write slots, page metadata), copy them into
the graph's static inputs, replay. No host-device sync. The graphs' decode attention is the
Triton kernel of kernels/decode_attention.py, which reads the page metadata (kv_indptr,
kv_indices, kv_last_page_len) from the bucket's static buffers; where it does not fit (another
dtype, head_dim or cache layout, or KernelConfig.triton_decode off) it is FlashInfer's decode wrapper, planned
per replay (it copies the metadata into its own fixed buffers).

Padding rows carry slot -1, which the K/V store kernel skips (kernels/kv_store.py), so a replay
writes nowhere the caller did not name; padding requests read one page (the first page of
request 0) and their logits are dropped.

With LoRA enabled on the Triton kernel (attach_lora), every graph carries the LoRA kernels; they
read a static per-token adapter-slot buffer (-1 = base model, and padding), filled per replay,
so one graph serves any mix of adapters, including none.
Graphs capture the caller's kv_cache tensors by address: a different cache (or block size)
drops the graphs and captures again. Warm-up runs write only into a scratch cache.

Under tensor parallelism the graphs hold the step's NCCL collectives (the row-parallel and
embedding all_reduces, the lm_head all_gather). NCCL requires every rank to capture the same
collectives in the same order and to replay matching graphs together; that holds because
whether a step replays, which bucket it takes and when a capture happens depend only on the
call's arguments (batch size, mode, masks, adapters, cache identity) and on configuration
every rank shares, never on rank-local state, and every rank makes the same calls (SPMD).
The warm-up runs before a capture execute the collectives eagerly, so the communicator is
initialised before anything is captured; the capture itself communicates nothing. It runs in
thread-local capture mode: the process group's watchdog thread may query its own events
meanwhile (legal from another thread in that mode, an error in the global mode).
"""

from __future__ import annotations

import weakref

import torch
from loguru import logger

from model_wrapper.attention.backend import AttentionBackend
from model_wrapper.forward_batch import ForwardBatch, ForwardMode
from model_wrapper.kernels.config import KernelConfig

DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32) + tuple(range(40, 257, 8))


class _Bucket:
    """Static buffers, the decode attention's metadata (the Triton kernel's, or FlashInfer's graph
    wrappers) and the captured graph of one batch size."""

    def __init__(self, size: int, max_pages: int, device, windows, backend, tc: bool, triton: bool,
                 unsplit_kv: bool):
        self.size = size
        # static inputs: token ids, positions, K/V slots (-1 = padding); one copy per replay
        self.inputs = torch.zeros(3, size, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slots = self.inputs.unbind(0)
        self.staging = torch.zeros(3, size, dtype=torch.int64).pin_memory()
        self.token_slot = torch.full((size,), -1, dtype=torch.int32, device=device)  # LoRA slots
        self.token_slot_staging = torch.full((size,), -1, dtype=torch.int32).pin_memory()
        # page indices travel pinned -> device ourselves: FlashInfer's plan copies host indices
        # with a blocking copy, device ones without
        self.indices_staging = torch.zeros(size * max_pages, dtype=torch.int32).pin_memory()
        self.indices = torch.zeros(size * max_pages, dtype=torch.int32, device=device)
        self.copied = torch.cuda.Event()  # staging may be refilled once its last copy is done
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.triton = triton
        self.wrappers = {}  # FlashInfer's, one per window
        if triton:  # the kernel's metadata: kv_indptr [size + 1], then kv_last_page_len [size]
            from model_wrapper.kernels.decode_attention import decode_splits

            self.meta = torch.zeros(2 * size + 1, dtype=torch.int32, device=device)
            self.meta_staging = torch.zeros(2 * size + 1, dtype=torch.int32).pin_memory()
            self.kv_indptr, self.kv_last = self.meta[: size + 1], self.meta[size + 1:]
            self.splits = decode_splits(size, backend.num_kv_heads, sms)
        else:
            self._flashinfer_wrappers(size, max_pages, device, windows, backend, tc, sms, unsplit_kv)
        self.graph = None
        self.logits = None

    def _flashinfer_wrappers(self, size, max_pages, device, windows, backend, tc, sms, unsplit_kv):
        import flashinfer

        # FlashInfer splits each request's KV over several programs (then merges) unless told not
        # to; with a program per (request, KV head) already filling the SMs the split only costs
        # (faster at large batches, slower at small ones: hence the rule). Unsplit replays are also
        # deterministic.
        self.split_kv = not unsplit_kv or size * backend.num_kv_heads < sms
        for w in windows:
            self.wrappers[w] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                backend.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tc,
                paged_kv_indptr_buffer=torch.zeros(size + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(size * max_pages, dtype=torch.int32, device=device),
                paged_kv_last_page_len_buffer=torch.zeros(size, dtype=torch.int32, device=device),
            )


class _GraphAttention(AttentionBackend):
    """The attention a captured step runs: the Triton decode kernel over the bucket's metadata, or
    the bucket's planned FlashInfer wrappers; nothing else."""

    name = "flashinfer-graph"

    def __init__(self, backend, bucket: _Bucket):
        super().__init__(backend.num_heads, backend.num_kv_heads, backend.head_dim, backend.scale)
        self.backend, self.bucket = backend, bucket
        self.kv_store = backend.kv_store  # skips the -1 slots of padding (KVStore.graph_safe)

    def plan(self, batch):  # planned by DecodeGraphRunner outside the graph
        pass

    def run(self, layer, q, k_cache, v_cache, window, batch, k=None, v=None):
        b = self.bucket
        if b.triton:
            from model_wrapper.kernels.decode_attention import paged_decode_attention

            return paged_decode_attention(q if q.stride(-1) == 1 else q.contiguous(), k_cache, v_cache, b.kv_indptr,
                                          b.indices, b.kv_last, self.scale, window=window, splits=b.splits)
        return b.wrappers[window].run(q, (k_cache, v_cache))


class DecodeGraphRunner:
    """The decode graphs of one ModelWrapper (which owns this runner): per bucket size its
    static buffers and captured graph, all in one memory pool.

    The wrapper is held by a weak proxy, so the pair forms no reference cycle: the graphs die
    with the wrapper by reference counting (also when gc.freeze() has frozen them). Under
    tensor parallelism that matters: NCCL waits, when its communicator is destroyed, until
    every graph holding its collectives is gone; release the generator first.
    """

    def __init__(self, wrapper, *, max_batch: int = 128, buckets=DEFAULT_BUCKETS, config: KernelConfig | None = None):
        self.mw = weakref.proxy(wrapper)
        self.config = config if config is not None else KernelConfig()  # triton_decode, unsplit_kv
        self.buckets = sorted(b for b in buckets if b <= max_batch) or [max_batch]
        self.max_batch = self.buckets[-1]
        self.windows = [None] + list(wrapper.backend.windows)
        self._graphs: dict[int, _Bucket] = {}
        self._key = None
        self._pool = None
        self.lora = None  # a LoraManager whose kernels the graphs carry

    def attach_lora(self, manager) -> None:
        """Capture LoRA into the graphs from now on when its kernel is graph-safe (Triton);
        otherwise steps with adapters run eagerly. Drops graphs captured without it."""
        self.lora = manager if getattr(manager, "kernel", None) == "triton" else None
        self._graphs, self._key, self._pool = {}, None, None

    def drop(self) -> None:
        """Forget every captured graph: the next replay of each bucket captures it again (after a
        change of kernel configuration, see ModelWrapper.set_kernel_config)."""
        self._graphs, self._key, self._pool = {}, None, None

    def can_run(self, batch: ForwardBatch) -> bool:
        return (batch.mode == ForwardMode.DECODE and batch.max_q == 1 and batch.spec_mask is None
                and batch.atten_mask is None and batch.batch_size <= self.max_batch
                and (not batch.uses_lora or self.lora is not None))

    def bucket_for(self, batch_size: int) -> int:
        """The captured batch size a step of batch_size requests replays: a function of the
        batch size and the configured buckets only (the same on every tensor-parallel rank)."""
        return next(s for s in self.buckets if s >= batch_size)

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
        indptr, indices, last = page_metadata(tables, lens, page, pin=not bucket.triton)
        n = indices.numel()
        bucket.indices_staging[:n] = indices
        bucket.indices[:n].copy_(bucket.indices_staging[:n], non_blocking=True)
        if bucket.triton:
            bucket.meta_staging[: b + 1] = indptr
            bucket.meta_staging[b + 1:] = last
            bucket.meta.copy_(bucket.meta_staging, non_blocking=True)
            return
        be = self.mw.backend
        for w, wrapper in bucket.wrappers.items():
            wrapper.plan(indptr, bucket.indices[:n], last, be.num_heads, be.num_kv_heads, be.head_dim, page,
                         window_left=-1 if w is None else w - 1, q_data_type=self.mw.dtype,
                         kv_data_type=self.mw.dtype, sm_scale=be.scale, disable_split_kv=not bucket.split_kv)

    def _triton_fits(self, kv_cache) -> bool:
        if not self.config.triton_decode:
            return False
        try:
            from model_wrapper.kernels import decode_attention
        except ImportError:  # no Triton
            return False
        k = kv_cache[0][0]
        return decode_attention.fits(self.mw.dtype, k.dtype, k.shape[-1]) and all(
            c.is_contiguous() for pair in kv_cache for c in pair)

    def _static_batch(self, bucket: _Bucket, block_size: int) -> ForwardBatch:
        one = torch.ones(bucket.size, dtype=torch.int32)
        return ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=bucket.input_ids, input_ids_cpu=None, positions=bucket.positions,
            positions_cpu=torch.zeros(bucket.size, dtype=torch.int64), slots=bucket.slots, slots_cpu=None,
            write_slots=bucket.slots, write_token_index=None, block_size=block_size,
            q_lens_cpu=one, seq_lens_cpu=one, qo_indptr_cpu=torch.arange(bucket.size + 1, dtype=torch.int32),
            block_tables_cpu=torch.zeros(bucket.size, 1, dtype=torch.int32),
            token_req=None, token_req_cpu=None, token_kv_index_cpu=None, lm_head_indices=None, spec_mask=None, atten_mask=None,
            max_q=1, max_kv=1, lora=None if self.lora is None else self.lora.make_graph_batch(bucket.token_slot,
                                                                                          bucket.lora_groups))

    def _capture(self, size: int, kv_cache, block_size: int) -> _Bucket:
        mw = self.mw
        max_pages = -(-mw.cfg.max_position_embeddings // block_size)
        bucket = _Bucket(size, max_pages, mw.device, self.windows, mw.backend, mw.backend.tensor_cores,
                         self._triton_fits(kv_cache), self.config.unsplit_kv)
        if self.lora is not None:  # the tokens grouped by adapter slot (LoraManager.groups_for)
            bucket.lora_groups = torch.zeros(self.lora.max_loras + 1, size + 1, dtype=torch.int32, device=mw.device)
            bucket.lora_groups_staging = torch.zeros(self.lora.max_loras + 1, size + 1, dtype=torch.int32).pin_memory()
        batch = self._static_batch(bucket, block_size)
        attn = _GraphAttention(mw.backend, bucket)
        # plan: every padding request reads page 0 of the scratch cache during warm-up
        self._plan(bucket, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), block_size)
        scratch = [(torch.zeros_like(k[:1]), torch.zeros_like(v[:1])) for k, v in kv_cache]
        bucket.slots.fill_(-1)  # warm-up writes nothing
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                mw.model(batch, scratch, attn, mw.kernels)
        torch.cuda.current_stream().wait_stream(stream)
        bucket.graph = torch.cuda.CUDAGraph()
        mode = "thread_local" if mw.tp.enabled else "global"
        with torch.cuda.graph(bucket.graph, pool=self._pool, capture_error_mode=mode):
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
        size = self.bucket_for(B)
        key = self._cache_key(kv_cache, batch.block_size)
        if key != self._key or size not in self._graphs:
            self.capture(kv_cache, batch.block_size, [size])
        bucket = self._graphs[size]
        st = bucket.staging
        bucket.copied.synchronize()
        st[:2].zero_()
        st[2].fill_(-1)
        st[0, :B] = batch.input_ids_cpu
        st[1, :B] = batch.positions_cpu
        st[2, :B] = batch.slots_cpu
        self._plan(bucket, batch.block_tables_cpu, batch.seq_lens_cpu, batch.block_size)
        bucket.inputs.copy_(st, non_blocking=True)
        if self.lora is not None:  # (staging buffers are refilled only after `copied`)
            ids = batch.adapter_ids
            bucket.token_slot_staging.fill_(-1)
            if ids is not None:
                bucket.token_slot_staging[:B] = torch.tensor(self.lora.slots_for(ids), dtype=torch.int32)
            bucket.token_slot.copy_(bucket.token_slot_staging, non_blocking=True)
            self.lora.groups_for(bucket.token_slot_staging, out=bucket.lora_groups_staging)
            bucket.lora_groups.copy_(bucket.lora_groups_staging, non_blocking=True)
        if batch.prev_token_ids is not None:  # ids still on the device (an engine running ahead)
            tokens, rows, index = batch.prev_token_ids
            bucket.input_ids.index_copy_(0, rows, tokens.index_select(0, index))
        bucket.copied.record()
        bucket.graph.replay()
        if batch.lm_head_indices is not None:
            return bucket.logits.index_select(0, batch.lm_head_indices)
        return bucket.logits[:B].clone()  # the static output is overwritten by the next replay
