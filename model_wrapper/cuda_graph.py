"""CUDA graphs for decode steps: the whole step (embedding to logits) captured per batch bucket.

A decode step with one token per request and no masks, whose batch fits the largest bucket,
replays a graph captured for the smallest bucket >= batch. A multi-token step (every request
2..16 new tokens: speculative verify of chains or spec_mask trees, small prefill chunks mixed with
decodes; no atten_mask) of at most max_verify_batch requests replays a graph of (batch bucket,
tokens-per-request bucket Q in q_buckets), where the backend has such graphs
(supports_verify_graphs): its tokens sit in a fixed-stride layout, request r at rows r * Q ..,
its own tokens first and padding after (slot -1, position 0, logits dropped), the spec_mask rows
as per-row mask bits in the attention's static buffers.

    step's tokens (packed):  | r0: a b c | r1: d e |            q_lens = [3, 2]
    bucket rows (Q = 4):     | a b c _ | d e _ _ | _ _ _ _ |    batch bucket 3 -> 4 requests...
    token_rows = [0, 1, 2, 4, 5]  (row of each packed token: logits and run-ahead ids go through it)

Any other step of at most KernelConfig.mixed_max_tokens tokens, causal, with lm_head_indices (one
logit row per request, as the engine asks), replays a mixed graph of (token bucket, request
bucket): model_wrapper/mixed_graph.py (MixedGraphRunner, owned by this runner, sharing its memory
pool, cache key, LoRA manager and rules). Prefill steps (chunks mixed with decodes) go there before
the verify graphs; multi-token decode steps (speculative verify) go to the verify graphs first.

Per replay, on the host only:
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
A step that asks for hidden states (batch.hidden_layers: a draft head reads them) replays graphs
of its own, captured with those layers (key (batch bucket, Q, layers)), which return (logits,
hidden) with hidden's rows picked as the logits' are. A model with per-token float inputs beside
the token ids (`graph_inputs`: {batch.extras name: (width, dtype)}, e.g. the EAGLE-3 head's
feature) gets a static buffer per name in every bucket, filled per replay from batch.extras; a
model that returns a tuple (the head: logits and its pre-norm output) returns it from the replay.

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
from model_wrapper.mixed_graph import MixedGraphRunner

DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32) + tuple(range(40, 257, 8))


DEFAULT_Q_BUCKETS = (2, 4, 8, 16)  # tokens per request of the verify graphs
MAX_VERIFY_BATCH = 64


def token_rows(batch: ForwardBatch, q: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Host int64 [T]: the verify bucket row of each of the step's tokens (token t, the i-th of
    request r, goes to row r * q + i; q >= batch.max_q)."""
    req = batch.token_req_cpu
    out = torch.empty(req.shape[0], dtype=torch.int64) if out is None else out
    torch.add(req * q, torch.arange(req.shape[0]), out=out)
    return out.sub_(batch.qo_indptr_cpu[:-1].to(torch.int64)[req])


def warm_up(mw, batch: ForwardBatch, attn, kv_cache, slots: torch.Tensor) -> None:
    """Before a capture (here and in mixed_graph.py): mw's model run twice over batch on a side
    stream, into a one-page scratch copy of each layer's cache, with the batch's K/V slots (slots)
    set to -1; the current stream then waits for it."""
    scratch = [(torch.zeros_like(k[:1]), torch.zeros_like(v[:1])) for k, v in kv_cache]
    slots.fill_(-1)  # warm-up writes nothing
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            mw.model(batch, scratch, attn, mw.kernels)
    torch.cuda.current_stream().wait_stream(stream)


class _Bucket:
    """Static inputs, the attention backend's graph state and the captured graph of one batch size
    (and, for a verify bucket, q rows per request: tokens = size * q rows)."""

    def __init__(self, size: int, device, attn_state, q: int = 1, layers=None, graph_inputs=None):
        self.size, self.q, self.layers = size, q, layers
        tokens = self.tokens = size * q
        # static inputs: token ids, positions, K/V slots (-1 = padding), and (verify) the bucket row
        # of each of the step's packed tokens; one copy per replay
        self.inputs = torch.zeros(4, tokens, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slots, self.token_rows = self.inputs.unbind(0)
        self.staging = torch.zeros(4, tokens, dtype=torch.int64).pin_memory()
        self.token_slot = torch.full((tokens,), -1, dtype=torch.int32, device=device)  # LoRA slots
        self.token_slot_staging = torch.full((tokens,), -1, dtype=torch.int32).pin_memory()
        self.copied = torch.cuda.Event()  # staging may be refilled once its last copy is done
        # the decode attention's static metadata (backend.init_cuda_graph_state), refilled per replay
        self.attn_state = attn_state
        # the model's per-token float inputs (graph_inputs), [tokens, width] each, refilled per replay
        self.extras = {name: torch.zeros(tokens, width, dtype=dtype, device=device)
                       for name, (width, dtype) in (graph_inputs or {}).items()}
        self.graph = None
        self.logits = None  # the captured output: logits, or a tuple with logits first


class DecodeGraphRunner:
    """The decode graphs of one ModelWrapper (which owns this runner): per bucket size its
    static buffers and captured graph, all in one memory pool.

    The wrapper is held by a weak proxy, so the pair forms no reference cycle: the graphs die
    with the wrapper by reference counting (also when gc.freeze() has frozen them). Under
    tensor parallelism that matters: NCCL waits, when its communicator is destroyed, until
    every graph holding its collectives is gone; release the generator first.
    """

    def __init__(self, wrapper, *, max_batch: int = 128, buckets=DEFAULT_BUCKETS, config: KernelConfig | None = None,
                 q_buckets=DEFAULT_Q_BUCKETS, max_verify_batch: int = MAX_VERIFY_BATCH):
        self.mw = weakref.proxy(wrapper)
        self.config = config if config is not None else KernelConfig()  # triton_decode, unsplit_kv, verify_graphs
        self.buckets = sorted(b for b in buckets if b <= max_batch) or [max_batch]
        self.max_batch = self.buckets[-1]
        self.q_buckets = sorted(q_buckets)
        self.verify_buckets = [b for b in self.buckets if b <= max_verify_batch] or self.buckets[:1]
        self._graphs: dict[tuple[int, int], _Bucket] = {}  # (batch bucket, tokens per request) -> bucket
        self._key = None
        self._pool = None
        self._verify_fits = None  # (cache key, whether the backend has verify graphs over that cache)
        self.lora = None  # a LoraManager whose kernels the graphs carry
        self.mixed = MixedGraphRunner(self)  # mixed and small prefill steps (model_wrapper/mixed_graph.py)

    def attach_lora(self, manager) -> None:
        """Capture LoRA into the graphs from now on when its kernel is graph-safe (Triton);
        otherwise steps with adapters run eagerly. Drops graphs captured without it."""
        self.lora = manager if getattr(manager, "kernel", None) == "triton" else None
        self.drop()

    def drop(self) -> None:
        """Forget every captured graph: the next replay of each bucket captures it again (after a
        change of kernel configuration, see ModelWrapper.set_kernel_config)."""
        self._graphs, self._key, self._pool = {}, None, None
        self.mixed.reset()

    def _use_cache(self, kv_cache, block_size: int) -> None:
        """Graphs replay over the cache they were captured with: another cache drops them all."""
        key = self._cache_key(kv_cache, block_size)
        if key != self._key:
            self.drop()
            self._key = key

    def can_run(self, batch: ForwardBatch, kv_cache=None) -> bool:
        """Whether the step replays a graph: a decode step; (kv_cache given) a prefill step the mixed
        graphs take (mixed_graph.py); a multi-token step of at most q_buckets[-1] tokens per request
        over a cache the backend has verify graphs for; any other step the mixed graphs take."""
        if (batch.atten_mask is not None or (batch.uses_lora and self.lora is None)
                or not all(name in batch.extras for name in self.graph_inputs)):
            return False
        return self._route(batch, kv_cache) is not None

    def _route(self, batch: ForwardBatch, kv_cache) -> str | None:
        """-> "decode", "verify", "mixed" or None (eager); a function of the call's arguments and the
        configuration only. Prefill steps (chunks mixed with decodes) prefer the packed mixed graphs
        over the verify graphs' fixed stride; multi-token decode steps (verify) the verify graphs."""
        if batch.max_q == 1 and batch.mode == ForwardMode.DECODE:
            return "decode" if batch.spec_mask is None and batch.batch_size <= self.max_batch else None
        # the mixed graphs return logits only, for models without extra graph inputs (not hidden states);
        # steps with adapters unless KernelConfig.mixed_lora_graphs is off (then the eager path)
        mixed = (batch.hidden_layers is None and not self.graph_inputs
                 and (not batch.uses_lora or self.config.mixed_lora_graphs) and self.mixed.can_run(batch, kv_cache))
        if mixed and batch.mode != ForwardMode.DECODE:
            return "mixed"
        if (batch.max_q > 1 and kv_cache is not None and bool(self.q_buckets) and batch.max_q <= self.q_buckets[-1]
                and batch.batch_size <= self.verify_buckets[-1] and self._verify_ok(kv_cache, batch.block_size)):
            return "verify"
        return "mixed" if mixed else None

    def _verify_ok(self, kv_cache, block_size: int) -> bool:
        key = self._cache_key(kv_cache, block_size)
        if self._verify_fits is None or self._verify_fits[0] != key:
            self._verify_fits = (key, self.mw.backend.supports_verify_graphs(kv_cache, self.config))
        return self._verify_fits[1] and self.config.verify_graphs

    def bucket_for(self, batch_size: int, q: int = 1) -> tuple[int, int]:
        """The captured (batch size, tokens per request) a step of batch_size requests of at most q
        tokens each replays: a function of those and the configured buckets only (the same on
        every tensor-parallel rank)."""
        if q == 1:
            return next(s for s in self.buckets if s >= batch_size), 1
        return next(s for s in self.verify_buckets if s >= batch_size), next(b for b in self.q_buckets if b >= q)

    def _cache_key(self, kv_cache, block_size):
        """The cache a graph was captured for: its tensors' addresses, shape, dtype (an FP8 cache runs
        other kernels) and block size."""
        return (len(kv_cache), kv_cache[0][0].data_ptr(), kv_cache[-1][1].data_ptr(),
                tuple(kv_cache[0][0].shape), kv_cache[0][0].dtype, block_size)

    @property
    def graph_inputs(self) -> dict:
        """The model's per-token float inputs in batch.extras: {name: (width, dtype)}."""
        return getattr(getattr(self.mw, "model", None), "graph_inputs", None) or {}

    @staticmethod
    def _key_of(size: int, q: int, layers) -> tuple:
        return (size, q) if layers is None else (size, q, tuple(layers))

    def _static_batch(self, bucket: _Bucket, block_size: int) -> ForwardBatch:
        q = getattr(bucket, "q", 1)
        tokens = bucket.size * q
        lens = torch.full((bucket.size,), q, dtype=torch.int32)
        batch = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=bucket.input_ids, input_ids_cpu=None, positions=bucket.positions,
            positions_cpu=torch.zeros(tokens, dtype=torch.int64), slots=bucket.slots, slots_cpu=None,
            write_slots=bucket.slots, write_token_index=None, block_size=block_size,
            q_lens_cpu=lens, seq_lens_cpu=lens, qo_indptr_cpu=torch.arange(bucket.size + 1, dtype=torch.int32) * q,
            block_tables_cpu=torch.zeros(bucket.size, 1, dtype=torch.int32),
            token_req=None, token_req_cpu=None, token_kv_index_cpu=None, lm_head_indices=None, spec_mask=None, atten_mask=None,
            max_q=q, max_kv=q, lora=None if self.lora is None else LoraStep(
                None, self.lora, self.lora.make_graph_batch(bucket.token_slot, bucket.lora_groups)))
        batch.hidden_layers = getattr(bucket, "layers", None)
        batch.extras.update(getattr(bucket, "extras", {}))
        return batch

    def _capture(self, size: int, kv_cache, block_size: int, q: int = 1, layers=None) -> _Bucket:
        mw = self.mw
        max_pages = -(-mw.cfg.max_position_embeddings // block_size)
        state = mw.backend.init_cuda_graph_state(size, max_pages, kv_cache, self.config, q_per_req=q) if q > 1 else \
            mw.backend.init_cuda_graph_state(size, max_pages, kv_cache, self.config)
        bucket = _Bucket(size, mw.device, state, q, None if layers is None else tuple(layers), self.graph_inputs)
        if self.lora is not None:  # the tokens grouped by adapter slot (LoraManager.groups_for)
            n = bucket.tokens + 1
            bucket.lora_groups = torch.zeros(self.lora.max_loras + 1, n, dtype=torch.int32, device=mw.device)
            bucket.lora_groups_staging = torch.zeros(self.lora.max_loras + 1, n, dtype=torch.int32).pin_memory()
        batch = self._static_batch(bucket, block_size)
        # the attention the graph runs; every padding request reads page 0 of the scratch cache during warm-up
        attn = mw.backend.init_forward_metadata_capture_cuda_graph(bucket.attn_state, block_size)
        warm_up(mw, batch, attn, kv_cache, bucket.slots)
        bucket.graph = torch.cuda.CUDAGraph()
        mode = "thread_local" if mw.tp.enabled else "global"
        with torch.cuda.graph(bucket.graph, pool=self._pool, capture_error_mode=mode):
            bucket.logits = mw.model(batch, kv_cache, attn, mw.kernels)
        self._pool = bucket.graph.pool()
        return bucket

    def capture(self, kv_cache, block_size: int, sizes=None, q: int = 1, layers=None) -> None:
        """Capture the buckets of q tokens per request ahead of time (largest first, sharing one
        memory pool); q > 1: verify buckets (sizes default to verify_buckets); layers: graphs
        that also return those hidden states (batch.hidden_layers)."""
        self._use_cache(kv_cache, block_size)
        for size in sorted(sizes or (self.buckets if q == 1 else self.verify_buckets), reverse=True):
            if self._key_of(size, q, layers) not in self._graphs:
                self._graphs[self._key_of(size, q, layers)] = self._capture(size, kv_cache, block_size, q, layers)
        logger.info("captured CUDA graphs for (batch size, tokens per request) {}", sorted(self._graphs))

    def run(self, batch: ForwardBatch, kv_cache):
        """Replay the step's bucket -> its logits [num_out, vocab] (or the model's tuple, e.g.
        (logits, hidden) for batch.hidden_layers), rows as the eager forward gives them."""
        if self._route(batch, kv_cache) == "mixed":
            return self.mixed.run(batch, kv_cache)
        B, T = batch.batch_size, batch.num_tokens
        size, q = self.bucket_for(B, batch.max_q)
        key = self._cache_key(kv_cache, batch.block_size)
        gkey = self._key_of(size, q, batch.hidden_layers)
        if key != self._key or gkey not in self._graphs:
            self.capture(kv_cache, batch.block_size, [size], q, batch.hidden_layers)
        bucket = self._graphs[gkey]
        st = bucket.staging
        bucket.copied.synchronize()
        st[:2].zero_()
        st[2].fill_(-1)
        rows = None
        if q == 1:
            st[0, :B] = batch.input_ids_cpu
            st[1, :B] = batch.positions_cpu
            st[2, :B] = batch.slots_cpu
            self.mw.backend.init_forward_metadata_replay_cuda_graph(bucket.attn_state, batch.block_tables_cpu,
                                                                    batch.seq_lens_cpu, batch.block_size)
        else:
            rows = token_rows(batch, q, out=st[3, :T])
            st[0].index_copy_(0, rows, batch.input_ids_cpu)
            st[1].index_copy_(0, rows, batch.positions_cpu)
            st[2].index_copy_(0, rows, batch.slots_cpu)
            self.mw.backend.init_forward_metadata_replay_cuda_graph(
                bucket.attn_state, batch.block_tables_cpu, batch.seq_lens_cpu, batch.block_size,
                q_lens_cpu=batch.q_lens_cpu, spec_mask=batch.spec_mask, token_rows=rows)
        bucket.inputs.copy_(st, non_blocking=True)
        if self.lora is not None:  # (staging buffers are refilled only after `copied`)
            self._fill_lora(bucket, batch, rows)
        if batch.prev_token_ids is not None:  # ids still on the device (an engine running ahead)
            tokens, prev_rows, index = batch.prev_token_ids
            if q > 1:  # packed token index -> bucket row
                prev_rows = bucket.token_rows.index_select(0, prev_rows)
            bucket.input_ids.index_copy_(0, prev_rows, tokens.index_select(0, index))
        for name, buf in bucket.extras.items():  # (padding rows keep stale values: their outputs are dropped)
            src = batch.extras[name].to(buf.dtype)
            if q == 1:
                buf[:B].copy_(src)
            else:
                buf.index_copy_(0, bucket.token_rows[:T], src)
        bucket.copied.record()
        bucket.graph.replay()
        if q > 1:  # the rows of the step's tokens (those lm_head_indices names), in its order
            rows = bucket.token_rows[:T]
            if batch.lm_head_indices is not None:
                rows = rows.index_select(0, batch.lm_head_indices)
        elif batch.lm_head_indices is not None:
            rows = batch.lm_head_indices
        else:
            rows = None  # the first B rows, copied: the static output is overwritten by the next replay
        outs = bucket.logits if isinstance(bucket.logits, tuple) else (bucket.logits,)
        outs = tuple(o[:B].clone() if rows is None else o.index_select(0, rows) for o in outs)
        return outs if isinstance(bucket.logits, tuple) else outs[0]

    def _fill_lora(self, bucket: _Bucket, batch: ForwardBatch, rows: torch.Tensor | None) -> None:
        """Each token's adapter slot (-1: base model, padding) and the tokens grouped by slot, into
        the bucket's staging buffers, then onto the device. rows: the bucket row of each token (verify)."""
        ids = None if batch.lora is None else batch.lora.adapter_ids
        bucket.token_slot_staging.fill_(-1)
        if ids is not None:
            slots = torch.tensor(self.lora.slots_for(ids), dtype=torch.int32)
            if rows is None:
                bucket.token_slot_staging[:batch.batch_size] = slots
            else:  # per request -> per token (one adapter for the whole batch: the same slot)
                per_token = slots.expand(batch.num_tokens) if slots.numel() == 1 else slots[batch.token_req_cpu]
                bucket.token_slot_staging.index_copy_(0, rows, per_token)
        bucket.token_slot.copy_(bucket.token_slot_staging, non_blocking=True)
        self.lora.groups_for(bucket.token_slot_staging, out=bucket.lora_groups_staging)
        bucket.lora_groups.copy_(bucket.lora_groups_staging, non_blocking=True)
