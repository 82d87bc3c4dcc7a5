"""CUDA graphs for decode steps: the whole step (embedding to logits) captured per batch bucket.

A decode step with one token per request, no masks and no LoRA, whose batch fits the largest
bucket, replays a graph captured for the smallest bucket >= batch. Per replay, on the host only:
fill pinned staging buffers (token ids, positions, write slots), copy them into the graph's
static inputs, let the attention backend fill its metadata, replay. No host-device sync. The
runner knows the attention backend only through its three hooks: init_cuda_graph_state (a
bucket's static attention buffers, before capture), init_forward_metadata_capture_cuda_graph
(the backend the captured step runs) and init_forward_metadata_replay_cuda_graph (the page
metadata of a replay); FlashInfer's are in attention/flashinfer_graph.py (the Triton decode
kernel, or FlashInfer's graph wrappers where it does not fit or KernelConfig.triton_decode is off).

Padding rows carry slot -1, which the K/V store kernel skips (kernels/kv_store.py), so a replay
writes nowhere the caller did not name; padding requests read one page (the first page of
request 0) and their logits are dropped.

With LoRA enabled on the Triton kernel (attach_lora), every graph carries the LoRA kernels; they
read a static per-token adapter-slot buffer (-1 = base model, and padding), filled per replay,
so one graph serves any mix of adapters, including none.
Graphs capture the caller's kv_cache tensors by address: a different cache (or block size, or
cache dtype) drops the graphs and captures again. Warm-up runs write only into a scratch cache.

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

from adapters.lora_layers import LoraStep
from model_wrapper.forward_batch import ForwardBatch, ForwardMode
from model_wrapper.kernels.config import KernelConfig

DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32) + tuple(range(40, 257, 8))


class _Bucket:
    """Static inputs, the attention backend's graph state and the captured graph of one batch size."""

    def __init__(self, size: int, device, attn_state):
        self.size = size
        # static inputs: token ids, positions, K/V slots (-1 = padding); one copy per replay
        self.inputs = torch.zeros(3, size, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slots = self.inputs.unbind(0)
        self.staging = torch.zeros(3, size, dtype=torch.int64).pin_memory()
        self.token_slot = torch.full((size,), -1, dtype=torch.int32, device=device)  # LoRA slots
        self.token_slot_staging = torch.full((size,), -1, dtype=torch.int32).pin_memory()
        self.copied = torch.cuda.Event()  # staging may be refilled once its last copy is done
        # the decode attention's static metadata (backend.init_cuda_graph_state), refilled per replay
        self.attn_state = attn_state
        self.graph = None
        self.logits = None


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
        """The cache a graph was captured for: its tensors' addresses, shape, dtype (an FP8 cache runs
        other kernels) and block size."""
        return (len(kv_cache), kv_cache[0][0].data_ptr(), kv_cache[-1][1].data_ptr(),
                tuple(kv_cache[0][0].shape), kv_cache[0][0].dtype, block_size)

    def _static_batch(self, bucket: _Bucket, block_size: int) -> ForwardBatch:
        one = torch.ones(bucket.size, dtype=torch.int32)
        return ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=bucket.input_ids, input_ids_cpu=None, positions=bucket.positions,
            positions_cpu=torch.zeros(bucket.size, dtype=torch.int64), slots=bucket.slots, slots_cpu=None,
            write_slots=bucket.slots, write_token_index=None, block_size=block_size,
            q_lens_cpu=one, seq_lens_cpu=one, qo_indptr_cpu=torch.arange(bucket.size + 1, dtype=torch.int32),
            block_tables_cpu=torch.zeros(bucket.size, 1, dtype=torch.int32),
            token_req=None, token_req_cpu=None, token_kv_index_cpu=None, lm_head_indices=None, spec_mask=None, atten_mask=None,
            max_q=1, max_kv=1, lora=None if self.lora is None else LoraStep(
                None, self.lora, self.lora.make_graph_batch(bucket.token_slot, bucket.lora_groups)))

    def _capture(self, size: int, kv_cache, block_size: int) -> _Bucket:
        mw = self.mw
        max_pages = -(-mw.cfg.max_position_embeddings // block_size)
        bucket = _Bucket(size, mw.device, mw.backend.init_cuda_graph_state(size, max_pages, kv_cache, self.config))
        if self.lora is not None:  # the tokens grouped by adapter slot (LoraManager.groups_for)
            bucket.lora_groups = torch.zeros(self.lora.max_loras + 1, size + 1, dtype=torch.int32, device=mw.device)
            bucket.lora_groups_staging = torch.zeros(self.lora.max_loras + 1, size + 1, dtype=torch.int32).pin_memory()
        batch = self._static_batch(bucket, block_size)
        # the attention the graph runs; every padding request reads page 0 of the scratch cache during warm-up
        attn = mw.backend.init_forward_metadata_capture_cuda_graph(bucket.attn_state, block_size)
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
        self.mw.backend.init_forward_metadata_replay_cuda_graph(bucket.attn_state, batch.block_tables_cpu,
                                                                batch.seq_lens_cpu, batch.block_size)
        bucket.inputs.copy_(st, non_blocking=True)
        if self.lora is not None:  # (staging buffers are refilled only after `copied`)
            ids = None if batch.lora is None else batch.lora.adapter_ids
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
