"""TextGenerator: the library's public face, and its one central call, forward_tensor.

A serving scheduler calls forward_tensor once per step with flat tensors (the contract:
docs/forward_tensor.md). The generator validates every argument (text_generator.validation),
builds the step's ForwardBatch once, and hands it to the ModelWrapper; nothing touches kv_cache
before validation has passed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Sequence

import torch
from loguru import logger

from adapters import LoraStep
from kv_manager import KVCacheSpec, allocate_kv_cache
from model_wrapper import ForwardBatch, KernelConfig, ModelConfig, ModelWrapper, TPGroup
from text_generator.errors import ErrorCode, ForwardArgumentError
from text_generator.validation import KVCacheMemo, validate_step


def host_thread_count(device: torch.device, requested: int | None = None,
                      environ: Mapping[str, str] = os.environ) -> int | None:
    """torch's CPU intra-op threads a TextGenerator sets for its process, or None: leave them as they are.

    requested (TextGenerator's host_threads): an int >= 1 sets that many, on any device. None: 1 where the
    model runs on a GPU and the environment does not set OMP_NUM_THREADS, else untouched (on the CPU those
    threads do the model's arithmetic). Why one on a GPU: a step's host work (validation, the step's
    metadata) is small CPU tensors issued from one Python thread, and torch's OpenMP pool, a thread a core by
    default, only contends with it: on an H100 host of 16 cores a Qwen3-30B-A3B 4k prefill, eager, took
    62.8-90.6 ms a call under the default 16 threads and 62.5-64.3 ms under one, where its kernels take 59;
    a 1-element index over 4096 positions took 1.4 ms after the GPU had run, 17 us with one thread
    (benchmarks/RESULTS.md, session 57). vLLM sets OMP_NUM_THREADS=1 for the same reason; the server's
    engine process (text_generator/serve/engine_worker.py) takes one on CUDA whatever the environment says."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ForwardArgumentError(ErrorCode.INVALID_HOST_THREADS, "host_threads",
                                       f"expected None or an int >= 1, got {requested!r}")
        return requested
    if torch.device(device).type == "cuda" and "OMP_NUM_THREADS" not in environ:
        return 1
    return None


class TextGenerator:
    """Owns a ModelWrapper (model, attention backend) and the names of loaded LoRA adapters.

    The KV cache is not owned here: the caller allocates it (see `allocate_kv_cache`) and its
    block manager decides which blocks each request uses.

    host_threads: torch's CPU intra-op threads for this process (host_thread_count): None sets one
    where the model runs on a GPU (unless OMP_NUM_THREADS is set), an int sets that many.
    """

    def __init__(self, model_wrapper: ModelWrapper, host_threads: int | None = None):
        threads = host_thread_count(model_wrapper.device, host_threads)
        if threads is not None and torch.get_num_threads() != threads:
            logger.info(f"torch CPU threads {torch.get_num_threads()} -> {threads} (host_threads: the steps' host "
                        "work is one Python thread; set OMP_NUM_THREADS or host_threads to choose)")
            torch.set_num_threads(threads)
        self.model_wrapper = model_wrapper
        self.lora_manager = None  # set by enable_lora(); adapter_ids need it
        self._kv_memo = KVCacheMemo()  # the cache validated last: the same one next step is not re-checked

    @classmethod
    def from_pretrained(cls, path: str, *, device=None, dtype=None, attention_backend: str = "auto",
                        cuda_graphs: bool = True, max_graph_batch: int = 256,
                        tp_group: TPGroup | None = None, kernel_config: KernelConfig | None = None,
                        progress: bool = True, quantization: str | None = None,
                        host_threads: int | None = None) -> "TextGenerator":
        """Load a local Hugging Face checkpoint folder (config.json + *.safetensors); no hub access.

        device: "cpu", "cuda", a torch.device, or None (CUDA when available).
        dtype: a torch.dtype, "float32" / "bfloat16" / "float16", or None (the checkpoint's own;
               fp32 checkpoints run in bf16 on CUDA).
        attention_backend: "auto" (FlashInfer on CUDA when installed, else torch), "torch", "flashinfer".
        cuda_graphs: replay captured CUDA graphs for decode steps of up to max_graph_batch
               requests (FlashInfer backend only); False runs every step eagerly.
        tp_group: tensor parallelism (model_wrapper.TPGroup; None: one rank holds the whole model).
               Under torchrun: init_process_group, then tp_group=TPGroup.from_default_group() and
               device=f"cuda:{local_rank}". Every rank must then make the same calls with the same
               tensors (SPMD); each loads only its weight slices, allocates a kv_cache of its own
               kv heads (kv_cache_spec is per rank) and gets the full-vocabulary logits.
        kernel_config: model_wrapper.KernelConfig, the CUDA kernels' launch constants (None: defaults).
        progress: a progress bar (tqdm, on stderr) while loading a checkpoint of several shards.
        quantization: None (the checkpoint as it is) or "fp8": a bf16 / fp16 / fp32 checkpoint's
               projections and experts quantized at load to block FP8 (e4m3, a scale per 128 x 128
               block; dynamic activations), as a fine-grained FP8 checkpoint (model_wrapper/online_fp8.py).
        host_threads: torch's CPU intra-op threads for this process (host_thread_count): None sets one where
               the model runs on a GPU, unless OMP_NUM_THREADS is set; an int sets that many.
        """
        host_thread_count(torch.device("cpu"), host_threads)  # a bad value is refused before the load
        return cls(ModelWrapper.from_pretrained(
            path, device=device, dtype=dtype, attention_backend=attention_backend,
            cuda_graphs=cuda_graphs, max_graph_batch=max_graph_batch, tp_group=tp_group,
            kernel_config=kernel_config, progress=progress, quantization=quantization), host_threads)

    # -- properties a scheduler needs ------------------------------------------------------
    @property
    def config(self) -> ModelConfig:
        return self.model_wrapper.cfg

    @property
    def device(self) -> torch.device:
        return self.model_wrapper.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model_wrapper.dtype

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_position_embeddings(self) -> int:
        return self.config.max_position_embeddings

    @property
    def tp_group(self) -> TPGroup:
        return self.model_wrapper.tp

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """This rank's KV-cache shape (its own kv heads under tensor parallelism)."""
        return self.model_wrapper.kv_cache_spec

    def kv_cache_dtype(self, dtype=None) -> torch.dtype:
        """The cache dtype a request names: None / "auto" -> the model's dtype; "fp8", "fp8_e4m3" (vLLM's
        name) or torch.float8_e4m3fn -> an FP8 cache (K/V scaled per layer by kv_scales); the model's own
        dtype as itself. Anything else: ForwardArgumentError(INVALID_KV_CACHE_DTYPE) naming kv_cache_dtype."""
        if dtype is None or dtype == "auto":
            return self.dtype
        runs = self.model_wrapper.kv_cache_dtypes()
        if dtype in ("fp8", "fp8_e4m3", torch.float8_e4m3fn) and torch.float8_e4m3fn not in runs:
            raise ForwardArgumentError(ErrorCode.INVALID_KV_CACHE_DTYPE, "kv_cache_dtype",
                                       f"expected None, 'auto' or {self.dtype}: an FP8 cache needs e4m3, a CUDA GPU "
                                       f"of compute capability 8.9+ (L4, L40S, H100, H200) or the CPU, and "
                                       f"{self.device} has none; got {dtype!r}")
        if dtype in ("fp8", "fp8_e4m3"):
            return torch.float8_e4m3fn
        if isinstance(dtype, torch.dtype) and dtype in runs:
            return dtype
        raise ForwardArgumentError(ErrorCode.INVALID_KV_CACHE_DTYPE, "kv_cache_dtype",
                                   f"expected None, 'auto', 'fp8' / 'fp8_e4m3', {self.dtype} or torch.float8_e4m3fn (e4m3 "
                                   f"only: no e5m2 cache), got {dtype!r}")

    def kv_cache_spec_for(self, dtype=None) -> KVCacheSpec:
        """kv_cache_spec with the elements of a cache of `dtype` (see kv_cache_dtype): an FP8 cache
        has 1-byte elements, so the block manager's sizing helpers fit twice as many blocks (vs 16-bit)."""
        return dataclasses.replace(self.kv_cache_spec, dtype=self.kv_cache_dtype(dtype))

    def allocate_kv_cache(self, num_blocks: int, block_size: int = 128, dtype=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Zeroed kv_cache for this model: per layer (k, v), each [num_blocks, block_size, kv_heads, head_dim].

        dtype: None (the model's dtype) or torch.float8_e4m3fn / "fp8": an FP8 cache, written as
        round(x / scale) in e4m3 and read as e4m3 * scale with the per-layer scales kv_scales."""
        return allocate_kv_cache(self.kv_cache_spec_for(dtype), num_blocks, block_size, self.device)

    # -- FP8 KV caches: per-layer K/V scales (text_generator/kv_scales.py) ----------------------
    @property
    def kv_scales(self) -> torch.Tensor:
        """[2, num_layers] float32 on the device: the K (row 0) and V (row 1) scales of FP8 caches."""
        return self.model_wrapper.kv_scales

    def set_kv_scales(self, k_scales, v_scales) -> None:
        """Set the FP8 caches' per-layer K and V scales ([num_layers] positive finite floats each;
        else ForwardArgumentError(INVALID_KV_SCALES), nothing changed). K/V written earlier into an
        FP8 cache keep the old scale's values: set scales before filling a cache."""
        from text_generator.kv_scales import check_kv_scales

        k, v = check_kv_scales(k_scales, v_scales, self.config.num_layers)
        self.model_wrapper.set_kv_scales(k, v)

    def calibrate_kv_scales(self, input_ids_list, *, block_size: int = 16) -> torch.Tensor:
        """Measure and set the FP8 K/V scales from prompts (lists of token ids or 1-D int tensors):
        each runs through a cache of the model's dtype and per layer k_scale = max |K| / 448,
        v_scale = max |V| / 448 over all of them. -> the scales set, [2, num_layers] float32 (CPU)."""
        from text_generator.kv_scales import calibrate_kv_scales

        scales = calibrate_kv_scales(self, input_ids_list, block_size=block_size)
        self.set_kv_scales(scales[0], scales[1])
        return scales

    def loaded_adapters(self) -> Sequence[str]:
        return () if self.lora_manager is None else self.lora_manager.list_adapters()

    # -- LoRA adapters (adapters.LoraManager; errors carry adapters.LoraErrorCode) ------------
    def enable_lora(self, max_loras: int = 8, max_rank: int = 64, *, max_num_tokens: int | None = None,
                    kernel: str = "auto", overlap: bool = True, fuse_expand: bool = True, fold="auto"):
        """Preallocate max_loras adapter slots of rank <= max_rank on the model's device; once.

        Under tensor parallelism the slots hold this rank's slices of A / B (load_adapter slices).

        max_num_tokens: preallocate the per-step mapping buffers too (for CUDA graphs).
        kernel: "auto" (on CUDA: Triton when installed, which also runs inside the decode CUDA
                graphs, else FlashInfer segment GEMM; torch elsewhere), "triton", "flashinfer",
                "torch". Returns the LoraManager (also self.lora_manager).
        overlap: with the triton kernel, run each projection's LoRA shrink on a side stream while
                its base GEMM runs (False: all on one stream, for A/B timings).
        fuse_expand: in decode graphs (max_rank <= 16) add the qkv and gate_up deltas inside the
                RoPE + K/V-store and SiLU-and-mul kernels, and the o and down deltas inside the
                residual add + RMSNorm (False: expand kernels of their own).
        fold: "auto", True or False: with the triton kernel, decode CUDA graphs and no tensor
                parallelism, move the A stacks into extra rows of the base weights so that in the
                decode graphs each base GEMM computes the LoRA shrink too (LoraManager.fold_into;
                "auto": where max_loras * max_rank <= 256 on CUDA). Projections holding FP8 weights
                (an FP8 checkpoint on CUDA) cannot take A rows: "auto" does not fold, True is refused.
        """
        from adapters import LoraError, LoraErrorCode, LoraManager, LoraStateError

        if self.lora_manager is not None:
            raise LoraStateError(LoraErrorCode.ALREADY_ENABLED, "enable_lora",
                                 f"expected a first call, got LoRA already enabled with max_loras="
                                 f"{self.lora_manager.max_loras}, max_rank={self.lora_manager.max_rank}")
        if self.model_wrapper.has_fp8_projections():
            if fold is True:
                raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "fold",
                                "expected 'auto' or False with FP8 projections (float8_e4m3fn weights cannot "
                                "take the adapters' bf16 A rows), got True")
            fold = False if fold == "auto" else fold
        cfg = self.config
        shard = self.model_wrapper.shard  # this rank's sizes (the whole model's without TP)
        self.lora_manager = LoraManager(
            num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, q_size=shard.num_heads * cfg.head_dim,
            kv_size=shard.num_kv_heads * cfg.head_dim, intermediate_size=shard.intermediate_size,
            max_loras=max_loras, max_rank=max_rank, device=self.device, dtype=self.dtype,
            max_num_tokens=max_num_tokens, kernel=kernel, overlap=overlap, fuse_expand=fuse_expand, fold=fold)
        # the projections wrapped, the A stacks folded where the decode graphs run, the graphs told
        self.model_wrapper.enable_lora(self.lora_manager)
        return self.lora_manager

    def load_adapter(self, name: str, path: str) -> int:
        """Load a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) as `name`.

        Safe between steps while other requests run; returns the slot it occupies. Needs
        enable_lora() first. Raises LoraError / LoraStateError with a LoraErrorCode.
        """
        from adapters import LoraErrorCode, LoraStateError

        if self.lora_manager is None:
            raise LoraStateError(LoraErrorCode.NOT_ENABLED, f"load_adapter(name={name!r})",
                                 "expected enable_lora() to be called first, got LoRA not enabled")
        if not self.tp_group.enabled:
            return self.lora_manager.load_adapter(name, path)
        # checked against the whole model's shapes, then cut to this rank's slices
        from adapters import LoraShapes
        from adapters.peft_adapter import read_peft_adapter

        cfg, shard = self.config, self.model_wrapper.shard
        shapes = LoraShapes(cfg.num_layers, cfg.hidden_size, cfg.num_heads * cfg.head_dim,
                            cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size)
        adapter = read_peft_adapter(name, path, shapes, max_rank=self.lora_manager.max_rank)
        adapter.weights = {key: shard.shard_lora(key[1], a, b) for key, (a, b) in adapter.weights.items()}
        return self.lora_manager.add_adapter(adapter)

    def unload_adapter(self, name: str) -> None:
        """Free `name`'s slot; later steps that name it are refused (TG_ADAPTER_NOT_LOADED)."""
        from adapters import LoraError, LoraErrorCode

        if self.lora_manager is None:
            code = LoraErrorCode.UNLOAD_BASE if name in (None, "base") else LoraErrorCode.NOT_LOADED
            raise LoraError(code, f"unload_adapter(name={name!r})",
                            "expected a loaded adapter, got none loaded (LoRA not enabled)")
        self.lora_manager.unload_adapter(name)

    def adapter_cache_key(self, name: str):
        """The prefix-cache key of K/V computed under the loaded adapter `name` (LoraManager.cache_key):
        a new one after every load, so a reload under the same name never reuses old K/V."""
        from adapters import LoraError, LoraErrorCode

        if self.lora_manager is None:
            raise LoraError(LoraErrorCode.NOT_LOADED, f"adapter_cache_key(name={name!r})",
                            "expected a loaded adapter, got none loaded (LoRA not enabled)")
        return self.lora_manager.cache_key(name)

    def list_adapters(self) -> list[str]:
        """Names of the loaded adapters, in load order ([] before enable_lora)."""
        return list(self.loaded_adapters())

    # -- the call --------------------------------------------------------------------------
    def forward_tensor(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        is_prefill: bool,
        kv_cache: list[tuple[torch.Tensor, torch.Tensor]],
        block_tables: torch.Tensor,
        slots: torch.Tensor,
        input_lengths: torch.Tensor,
        max_seq_len: int,
        lm_head_indices: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run one step; return float32 logits [num_out, vocab_size] on the model's device (with
        output_hidden_states, the pair (logits, hidden [num_out, len(output_hidden_states), hidden_size])).

        input_ids      [num_tokens] int: new tokens of every request, request after request
        position_ids   [num_tokens] int: absolute position of each new token
        is_prefill     bool: prompt (chunk) tokens vs decode token(s)
        kv_cache       per layer (k_cache, v_cache), each [num_blocks, block_size, kv_heads, head_dim]
        block_tables   [batch, max_blocks] int32: each request's blocks in order; padding never read
        slots          [num_tokens] int: block_id * block_size + offset where each token's K/V goes; -1 = none
        input_lengths  [batch] int: KV length of each request after this step
        max_seq_len    int: the caller's longest allowed sequence (<= the model's limit)
        lm_head_indices [num_out] int or None: which tokens' logits to return (None: all)
        kwargs: q_lens [batch], spec_mask [num_tokens, max(q_lens)], atten_mask
                [num_tokens, max(input_lengths)], adapter_ids (list of str/None), max_out_len (int),
                prev_token_ids (tokens on the device, rows, index): input_ids[rows] = tokens[index],
                taken on the device, for an engine that runs ahead of its sampled tokens,
                output_hidden_states (list of distinct ints in [0, num_layers]): also return those
                states of the lm_head_indices rows (0 = embeddings, i = input of layer i,
                num_layers = final normed state; transformers' numbering), float32, for draft heads
        Raises ForwardArgumentError (ValueError) with an ErrorCode; kv_cache is then untouched.
        """
        cfg = self.config
        mw = self.model_wrapper
        step = validate_step(
            input_ids=input_ids, position_ids=position_ids, is_prefill=is_prefill, kv_cache=kv_cache,
            block_tables=block_tables, slots=slots, input_lengths=input_lengths, max_seq_len=max_seq_len,
            lm_head_indices=lm_head_indices, kwargs=kwargs,
            num_layers=cfg.num_layers, num_kv_heads=mw.shard.num_kv_heads, head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size, model_max_len=cfg.max_position_embeddings,
            dtype=mw.dtype, device=mw.device, loaded_adapters=self.loaded_adapters(), kv_memo=self._kv_memo,
            cache_dtypes=mw.kv_cache_dtypes(),
        )
        batch = ForwardBatch.build(
            input_ids=step.input_ids, input_ids_cpu=step.input_ids_cpu, positions=step.positions, slots=step.slots,
            is_prefill=step.is_prefill, block_size=step.block_size, q_lens_cpu=step.q_lens,
            seq_lens_cpu=step.input_lengths, block_tables_cpu=step.block_tables,
            lm_head_indices=step.lm_head_indices, spec_mask=step.spec_mask,
            atten_mask=step.atten_mask, device=mw.device,
            token_req_cpu=step.token_req, token_kv_index_cpu=step.token_kv_index,
            prev_token_ids=step.prev_token_ids,
        )
        if step.adapter_ids is not None:  # mapped by a graph replay, or by make_batch before an eager run
            batch.lora = LoraStep(step.adapter_ids, self.lora_manager)
        batch.hidden_layers = step.hidden_layers
        return mw.forward(batch, kv_cache)
