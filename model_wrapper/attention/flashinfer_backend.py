"""Paged attention on CUDA with FlashInfer: plan once per step on the host, run per layer.

Dispatch per step (vLLM's split of decodes and prefills, pymllm's tensor-core heuristic):
    pure decode, one token per request, no mask  -> BatchDecodeWithPagedKVCacheWrapper
    prefill where no request has K/V from before this step (no cached prefix, no earlier chunk,
        every slot written) -> BatchPrefillWithRaggedKVCacheWrapper over the step's own K/V
        (the layer passes it to run(); the caches are still written for later steps)
    prefill / chunked prefill / multi-token decode -> BatchPrefillWithPagedKVCacheWrapper, causal
        (FlashInfer aligns causality to the end of each sequence: query i of a request with
         q_len q and kv_len L sits at kv index L - q + i, exactly our contract)
    mixed batch (prefill chunks + single-token decodes) -> decode rows to the decode kernel, the
        rest to the prefill kernel; outputs written back in token order
    spec_mask / atten_mask -> prefill kernel with a custom mask (attention/masks.py, fa2)
    sliding window -> window_left = W - 1 (one planned wrapper per distinct window); folded into
        the custom mask when there is one

FP8 (e4m3) caches (kv_cache_dtype, set by the wrapper before plan): planned with q_data_type = the
model's dtype and kv_data_type = e4m3; never the ragged path (it would attend over the unrounded
step K/V); paged prefill on fa2 (fa3 does not build for e4m3 K/V with 16-bit q); run() gets the
layer's k_scale (folded into sm_scale) and v_scale (multiplies the output) as host floats. Where
KernelConfig.fp8_kv_prefill is "fa3", or "auto" (the default) with its module built, and the GPU is sm90
(head_dim 64 / 128 / 256), the paged prefill
steps without a custom mask (and the prefill rows of mixed ones) of layers without a sliding window run
fa3 with q rounded to e4m3 instead (Fa3Fp8Prefill, attention/fa3_fp8.py: q scale 1.0, the layer's K/V
scales per KV head on the device). Their
single-token decode rows (pure decode steps and the decode part of mixed ones) run the Triton
decode kernel instead where KernelConfig.fp8_kv_decode is "triton" (the faster of the two:
benchmarks/bench_fp8_kv.py: the default) and it fits: TritonDecode, the scales read on the device.

All page metadata is built from host copies (block_tables_cpu, seq_lens_cpu, q_lens_cpu), so
planning needs no device sync:
    pages_r = ceil(L_r / page), kv_indptr = [0, cumsum(pages)], kv_indices = used block ids,
    last_page_len_r = L_r - (pages_r - 1) * page
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model_wrapper.attention import fa3_fp8
from model_wrapper.attention.backend import AttentionBackend
from model_wrapper.attention.flashinfer_graph import (DecodeGraphState, GraphAttention, fp8_scales, make_state,
                                                      plan_replay)
from model_wrapper.attention.masks import flat_custom_mask
from model_wrapper.forward_batch import ForwardBatch, ForwardMode

_CUDA_CORE_GROUPS = {1, 2, 3, 4, 6, 8, 16}  # GQA group sizes FlashInfer's CUDA-core decode kernel has
WORKSPACE_BYTES = 128 * 1024 * 1024


def use_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    """Tensor-core decode when the GQA group is large (>= 4 fuses the group into the MMA tile,
    as pymllm's should_use_tensor_core) or a size the CUDA-core kernel lacks."""
    group = num_heads // num_kv_heads
    return group >= 4 or group not in _CUDA_CORE_GROUPS


def page_metadata(block_tables_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor, page: int, pin: bool = True):
    """-> (kv_indptr [B+1] int32, kv_indices [sum pages] int32, last_page_len [B] int32), on the host.

    With pin, indptr and last_page_len come back in pinned memory: plan() copies them to the
    device, and a copy from pageable memory would make CUDA wait for the stream, serialising host
    and GPU."""
    L = seq_lens_cpu.to(torch.int64)
    pages = (L + page - 1) // page
    indptr = torch.zeros(L.shape[0] + 1, dtype=torch.int32)
    torch.cumsum(pages, 0, out=indptr[1:])
    used = torch.arange(block_tables_cpu.shape[1])[None, :] < pages[:, None]
    indices = block_tables_cpu[used].to(torch.int32)
    last = (L - (pages - 1) * page).to(torch.int32)
    return (indptr.pin_memory(), indices, last.pin_memory()) if pin else (indptr, indices, last)


def only_own_kv(batch: ForwardBatch) -> bool:
    """Whether every token attends to K/V of its own step only (host tensors, no sync): each
    request's KV length is its q_len (no cached prefix, no earlier chunk; token i of a request
    then sits at kv index i) and every token's K/V is written (no -1 slot)."""
    return batch.write_token_index is None and torch.equal(batch.seq_lens_cpu.long(), batch.q_lens_cpu.long())


@dataclass
class TritonDecode:
    """Single-token decode rows over an e4m3 cache on kernels/decode_attention.py (every window:
    the kernel takes it per call). Device page metadata: kv_indptr [B+1], kv_indices, kv_last [B]
    int32; splits: KV splits per (request, KV head) by decode_splits."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last: torch.Tensor
    splits: int
    cuda: bool = False  # KernelConfig.fp8_kv_decode_cuda: kernels/e4m3_decode_cuda.py where it fits

    def run(self, q, k_cache, v_cache, window, scale, k_scale, v_scale):
        from model_wrapper.kernels.decode_attention import paged_decode_attention

        return paged_decode_attention(q if q.stride(-1) == 1 else q.contiguous(), k_cache, v_cache, self.kv_indptr,
                                      self.kv_indices, self.kv_last, scale, window=window, splits=self.splits,
                                      k_scale=k_scale, v_scale=v_scale, cuda=self.cuda)


@dataclass
class Fa3Fp8Prefill:
    """A planned fa3 prefill wrapper of the all-e4m3 module over an e4m3 cache (attention/fa3_fp8.py):
    q_scale [num_heads] float32 (fa3_fp8.Q_SCALE each), scales [2, num_layers, num_kv_heads] float32:
    the K/V store's per-layer scales per KV head (fa3_fp8.head_scales, made at plan), all on the device."""

    wrapper: object
    q_scale: torch.Tensor
    scales: torch.Tensor

    def run(self, q, k_cache, v_cache, layer):
        return self.wrapper.run(fa3_fp8.quantize_q(q), (k_cache, v_cache), self.q_scale, self.scales[0, layer],
                                self.scales[1, layer])


@dataclass
class PagedPlan:
    """One kind of kernel for the whole step over the paged caches: wrappers maps each window
    (None: full attention) to its planned decode, prefill or masked-prefill wrapper."""

    wrappers: dict


@dataclass
class RaggedPlan:
    """A prefill over the step's own K/V only (only_own_kv): wrappers maps each window to its
    planned ragged wrapper; run() needs the step's k, v [T, num_kv_heads, head_dim]."""

    wrappers: dict


@dataclass
class SplitPlan:
    """A mixed step: the single-token decode rows to decode wrappers, the rest to prefill wrappers.

    decode, prefill: window -> planned wrapper of each part
    decode_tokens:   [T_decode] int64, device: the decode rows of q, in token order
    prefill_tokens:  [T_prefill] int64, device: the other rows
    """

    decode: dict
    prefill: dict
    decode_tokens: torch.Tensor
    prefill_tokens: torch.Tensor


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    supports_cuda_graphs = True

    def __init__(self, num_heads, num_kv_heads, head_dim, *, device, dtype, layer_windows=(), scale=None):
        super().__init__(num_heads, num_kv_heads, head_dim, scale)
        self.kv_dtype = dtype
        import flashinfer

        self._fi = flashinfer
        self.device = torch.device(device)
        self.windows = sorted({w for w in layer_windows if w is not None}) or []
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.tensor_cores = use_tensor_cores(num_heads, num_kv_heads)
        self._decode: dict[int | None, object] = {}
        self._prefill: dict[int | None, object] = {}
        self._masked: dict[int | None, object] = {}
        self._ragged: dict[int | None, object] = {}
        self._prefill8: dict[int | None, object] = {}  # fa3, all-e4m3 (fp8_kv_prefill == "fa3")
        self._q_scale: torch.Tensor | None = None
        self._head_scales: torch.Tensor | None = None  # [2, num_layers, num_kv_heads], per "prefill8" plan
        self._plan: PagedPlan | RaggedPlan | SplitPlan | None = None

    @property
    def _fp8(self) -> bool:
        return self.kv_cache_dtype == torch.float8_e4m3fn

    # wrappers are made lazily, one per (kind, window, FP8 cache or not), and reused across steps
    def _wrapper(self, kind: str, window):
        fi = self._fi
        table = {"decode": self._decode, "prefill": self._prefill, "masked": self._masked,
                 "ragged": self._ragged, "prefill8": self._prefill8}[kind]
        key = (window, self._fp8)
        if key not in table:
            if kind == "decode":
                table[key] = fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_tensor_cores=self.tensor_cores)
            elif kind == "ragged":
                table[key] = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend="auto")
            elif kind == "prefill8":
                table[key] = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa3")
            else:
                table[key] = fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", backend="fa2" if kind == "masked" or self._fp8 else "auto")
        return table[key]

    def _common(self, dtype):
        kv = torch.float8_e4m3fn if self._fp8 else dtype
        return dict(q_data_type=dtype, kv_data_type=kv, sm_scale=self.scale)

    def _triton_fp8_decode(self) -> bool:
        """Whether this step's single-token decode rows go to the Triton kernel (an e4m3 cache and
        KernelConfig.fp8_kv_decode == "triton", read from the K/V store that holds the config)."""
        if not self._fp8 or getattr(self.kv_store.config, "fp8_kv_decode", "flashinfer") != "triton":
            return False
        try:
            from model_wrapper.kernels import decode_attention
        except ImportError:  # no Triton
            return False
        return decode_attention.fits(self.kv_dtype, torch.float8_e4m3fn, self.head_dim)

    def _plan_triton_decode(self, indptr, indices, last) -> TritonDecode:
        from model_wrapper.kernels.decode_attention import cuda_e4m3, decode_splits

        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        dev = [x.to(self.device, non_blocking=True) for x in (indptr, last)]
        cuda = cuda_e4m3(self.kv_store.config, last.shape[0])
        return TritonDecode(dev[0], indices, dev[1],
                            decode_splits(last.shape[0], self.num_kv_heads, sms, torch.float8_e4m3fn, cuda=cuda), cuda)

    def _plan_decode(self, window, indptr, indices, last, page, dtype):
        w = self._wrapper("decode", window)
        w.plan(indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, page,
               window_left=-1 if window is None else window - 1, **self._common(dtype))
        return w

    def _fa3_fp8_prefill(self) -> bool:
        """Whether this step's paged prefill rows run fa3 all-e4m3 (Fa3Fp8Prefill): an e4m3 cache, a 16-bit
        model, the kernel's GPU (sm90) and head dims, and KernelConfig.fp8_kv_prefill "fa3", or "auto" with the
        module already built (fa3_fp8.prebuilt)."""
        mode = getattr(self.kv_store.config, "fp8_kv_prefill", "fa2")
        if not (self._fp8 and mode != "fa2" and self.kv_dtype in (torch.bfloat16, torch.float16)
                and fa3_fp8.supported(self.head_dim, self.device)):
            return False
        return mode == "fa3" or fa3_fp8.prebuilt(self.head_dim, self.kv_dtype)

    def _prefill_kind(self, window) -> str:
        """The wrapper kind of this step's unmasked paged prefill rows of layers with `window`: "prefill8" (fa3
        all-e4m3) or "prefill". Sliding-window layers stay on fa2: FlashInfer builds a window into its own module
        (use_swa), a second all-e4m3 build that no model measured here needs."""
        return "prefill8" if window is None and self._fa3_fp8_prefill() else "prefill"

    def _plan_prefill(self, kind, window, qo_indptr, indptr, indices, last, page, dtype, mask=None):
        w = self._wrapper(kind, window)
        kw = fa3_fp8.plan_kwargs(dtype, self.scale) if kind == "prefill8" else self._common(dtype)
        w.plan(qo_indptr, indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, page,
               causal=mask is None, custom_mask=mask,
               window_left=-1 if (window is None or mask is not None) else window - 1, **kw)
        if kind != "prefill8":
            return w
        if self._q_scale is None:
            self._q_scale = torch.full((self.num_heads,), fa3_fp8.Q_SCALE, dtype=torch.float32, device=self.device)
        return Fa3Fp8Prefill(w, self._q_scale, self._head_scales)

    def _plan_ragged(self, window, qo_indptr, dtype):
        w = self._wrapper("ragged", window)
        w.plan(qo_indptr, qo_indptr, self.num_heads, self.num_kv_heads, self.head_dim, causal=True,
               window_left=-1 if window is None else window - 1, **self._common(dtype))
        return w

    def plan(self, batch: ForwardBatch) -> None:
        dev, page = self.device, batch.block_size
        dtype = self.kv_dtype
        windows = [None] + self.windows
        q = batch.q_lens_cpu
        custom = batch.spec_mask is not None or batch.atten_mask is not None

        def to_dev(x):  # pinned, so that the copy does not block the host
            return x.pin_memory().to(dev, non_blocking=True)

        if custom:
            indptr, indices, last = page_metadata(batch.block_tables_cpu, batch.seq_lens_cpu, page)
            d_indices = to_dev(indices)
            qo = batch.qo_indptr_cpu.pin_memory()
            self._plan = PagedPlan({
                w: self._plan_prefill("masked", w, qo, indptr, d_indices, last, page, dtype,
                                      mask=to_dev(flat_custom_mask(batch, w)))
                for w in windows})
            return
        if batch.max_q == 1:  # every request decodes one token
            indptr, indices, last = page_metadata(batch.block_tables_cpu, batch.seq_lens_cpu, page)
            d_indices = to_dev(indices)
            if self._triton_fp8_decode():
                tr = self._plan_triton_decode(indptr, d_indices, last)
                self._plan = PagedPlan({w: tr for w in windows})
                return
            self._plan = PagedPlan({w: self._plan_decode(w, indptr, d_indices, last, page, dtype) for w in windows})
            return
        is_dec = (q == 1) & (batch.seq_lens_cpu > 1) if batch.mode == ForwardMode.MIXED else torch.zeros_like(q, dtype=torch.bool)
        if not bool(is_dec.any()):
            qo = batch.qo_indptr_cpu.pin_memory()
            if only_own_kv(batch) and not self._fp8:  # nothing cached: the step's own K/V, no page table
                self._plan = RaggedPlan({w: self._plan_ragged(w, qo, dtype) for w in windows})
                return
            indptr, indices, last = page_metadata(batch.block_tables_cpu, batch.seq_lens_cpu, page)
            d_indices = to_dev(indices)
            self._make_head_scales(self._prefill_kind(None))
            self._plan = PagedPlan({
                w: self._plan_prefill(self._prefill_kind(w), w, qo, indptr, d_indices, last, page, dtype)
                for w in windows})
            return
        # mixed: split requests; decode requests have exactly one token each
        dec_req = torch.nonzero(is_dec).flatten()
        pre_req = torch.nonzero(~is_dec).flatten()
        tok_is_dec = torch.repeat_interleave(is_dec, q.to(torch.int64))
        dec_tok = torch.nonzero(tok_is_dec).flatten()
        pre_tok = torch.nonzero(~tok_is_dec).flatten()
        d_ind, d_idx, d_last = page_metadata(batch.block_tables_cpu[dec_req], batch.seq_lens_cpu[dec_req], page)
        p_ind, p_idx, p_last = page_metadata(batch.block_tables_cpu[pre_req], batch.seq_lens_cpu[pre_req], page)
        p_qo = torch.zeros(pre_req.shape[0] + 1, dtype=torch.int32)
        torch.cumsum(q[pre_req], 0, out=p_qo[1:])
        p_qo = p_qo.pin_memory()
        d_idx, p_idx = to_dev(d_idx), to_dev(p_idx)
        if self._triton_fp8_decode():
            tr = self._plan_triton_decode(d_ind, d_idx, d_last)
            dec = {w: tr for w in windows}
        else:
            dec = {w: self._plan_decode(w, d_ind, d_idx, d_last, page, dtype) for w in windows}
        self._make_head_scales(self._prefill_kind(None))
        pre = {w: self._plan_prefill(self._prefill_kind(w), w, p_qo, p_ind, p_idx, p_last, page, dtype)
               for w in windows}
        self._plan = SplitPlan(dec, pre, to_dev(dec_tok), to_dev(pre_tok))

    def _make_head_scales(self, kind: str) -> None:
        """Before planning "prefill8" wrappers: the K/V store's scales per KV head for this step (one copy, on
        the device: set_kv_scales between steps is seen at the next plan)."""
        if kind == "prefill8":
            self._head_scales = fa3_fp8.head_scales(self.kv_store.scales, self.num_kv_heads)

    def run(self, layer, q, k_cache, v_cache, window, batch, k=None, v=None):
        plan = self._plan
        if isinstance(plan, PagedPlan):
            return self._run_paged(plan.wrappers[window], layer, q, k_cache, v_cache, window)
        if isinstance(plan, RaggedPlan):
            if k is None or v is None:
                raise RuntimeError("a step planned for ragged prefill needs its own k and v in run()")
            return plan.wrappers[window].run(q, k, v)
        dec_tok, pre_tok = plan.decode_tokens, plan.prefill_tokens
        out = torch.empty_like(q)
        out.index_copy_(0, dec_tok, self._run_paged(plan.decode[window], layer, q.index_select(0, dec_tok), k_cache,
                                                    v_cache, window))
        out.index_copy_(0, pre_tok, self._run_paged(plan.prefill[window], layer, q.index_select(0, pre_tok), k_cache,
                                                    v_cache, window))
        return out

    def _run_paged(self, wrapper, layer, q, k_cache, v_cache, window):
        """One planned wrapper (FlashInfer's, or TritonDecode) over the paged caches."""
        if isinstance(wrapper, TritonDecode):
            return wrapper.run(q, k_cache, v_cache, window, self.scale, *self.kv_store.layer_scales(layer))
        if isinstance(wrapper, Fa3Fp8Prefill):
            return wrapper.run(q, k_cache, v_cache, layer)
        return wrapper.run(q, (k_cache, v_cache), **fp8_scales(self.kv_store, layer, k_cache.dtype))

    # -- CUDA graphs (attention/flashinfer_graph.py) ------------------------------------------------
    def init_cuda_graph_state(self, size, max_pages, kv_cache, config, q_per_req: int = 1) -> DecodeGraphState:
        """The Triton decode kernel's metadata where it fits (K/V of the model's 16-bit dtype or e4m3, a
        power-of-two head_dim, contiguous caches) and is chosen (16-bit caches: config.triton_decode;
        e4m3: config.fp8_kv_decode == "triton"); else FlashInfer's graph
        wrappers, one per window (planned unsplit where config.unsplit_kv and the pairs fill the SMs).
        A verify bucket (q_per_req > 1) always runs the Triton verify kernel (supports_verify_graphs)."""
        triton = self._triton_decode_fits(kv_cache, config, q_per_req > 1)
        return make_state(self, size, max_pages, [None] + self.windows, triton, config.unsplit_kv, q_per_req,
                          kv_cache[0][0].dtype)

    def supports_verify_graphs(self, kv_cache, config) -> bool:
        return config.verify_graphs and self._triton_decode_fits(kv_cache, config, True)

    def _triton_decode_fits(self, kv_cache, config, verify: bool = False) -> bool:
        fp8 = kv_cache[0][0].dtype == torch.float8_e4m3fn  # e4m3 caches: config.fp8_kv_decode decides
        if not (config.triton_decode or verify or fp8):
            return False
        try:
            from model_wrapper.kernels import decode_attention
        except ImportError:  # no Triton
            return False
        k = kv_cache[0][0]
        if verify and k.dtype != self.kv_dtype:  # the verify kernel reads 16-bit caches only (not e4m3)
            return False
        if k.dtype == torch.float8_e4m3fn and config.fp8_kv_decode != "triton":
            return False
        return decode_attention.fits(self.kv_dtype, k.dtype, k.shape[-1]) and all(
            c.is_contiguous() for pair in kv_cache for c in pair)

    def init_forward_metadata_capture_cuda_graph(self, state: DecodeGraphState, page: int) -> GraphAttention:
        plan_replay(self, state, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), page)
        return GraphAttention(self, state)

    def init_forward_metadata_replay_cuda_graph(self, state: DecodeGraphState, block_tables_cpu, seq_lens_cpu,
                                                page, q_lens_cpu=None, spec_mask=None, token_rows=None) -> None:
        plan_replay(self, state, block_tables_cpu, seq_lens_cpu, page, q_lens_cpu, spec_mask, token_rows)
