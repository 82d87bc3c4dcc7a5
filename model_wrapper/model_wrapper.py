"""ModelWrapper: turns one step's ForwardBatch and the caller's kv_cache into logits.

Owns the loaded model, the attention backend and the rotary frequencies. Per step: plan the
backend once, compute cos/sin once, run the decoder (every layer shares both). Under tensor
parallelism (tp_group of world > 1) the model, backend and KV-cache spec are this rank's: local
q / kv heads (model_wrapper/parallel.py); the logits are the full vocabulary on every rank.
"""

from __future__ import annotations

import os

import torch
from loguru import logger

from kv_manager import KVCacheSpec
from model_wrapper.attention import AttentionBackend, TorchAttentionBackend
from model_wrapper.attention.kv_store import FP8_DTYPE, KVStore
from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.layers.fp8_linear import runs_e4m3
from model_wrapper.layers.kernels import FlashInferKernels, TorchKernels
from model_wrapper.layers.rotary import inv_frequencies
from model_wrapper.loader import load_model
from model_wrapper.models.decoder import CausalLM
from model_wrapper.online_fp8 import with_quantization
from model_wrapper.parallel import TPGroup, TPShard

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def resolve_dtype(dtype, cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ModelLoadError(
                ModelErrorCode.UNSUPPORTED_DTYPE,
                f"dtype: expected torch.float32, torch.bfloat16 or torch.float16, got {dtype}",
            )
        return dtype
    if dtype in (None, "auto"):
        d = _DTYPES.get(cfg.dtype_name.replace("torch.", ""), torch.float32)
        # fp32 checkpoints run in bf16 on GPUs, as vLLM's dtype="auto" does
        return torch.bfloat16 if (device.type == "cuda" and d == torch.float32) else d
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ModelLoadError(
        ModelErrorCode.UNSUPPORTED_DTYPE, f"dtype: expected one of {sorted(_DTYPES)} or a torch.dtype, got {dtype!r}"
    )


def make_backend(name: str, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 shard: TPShard | None = None) -> AttentionBackend:
    """shard: this rank's head counts under tensor parallelism (None: the whole model's)."""
    heads = shard if shard is not None else cfg
    args = (heads.num_heads, heads.num_kv_heads, cfg.head_dim)
    if name == "auto":
        name = "flashinfer" if device.type == "cuda" and _flashinfer_available() else "torch"
    if name == "torch":
        return TorchAttentionBackend(*args)
    if name == "flashinfer":
        if device.type != "cuda" or not _flashinfer_available():
            raise ModelLoadError(
                ModelErrorCode.BACKEND_UNAVAILABLE,
                f"attention_backend='flashinfer' needs CUDA and flashinfer-python (device={device})",
            )
        from model_wrapper.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(*args, device=device, dtype=dtype, layer_windows=cfg.layer_windows)
    raise ModelLoadError(
        ModelErrorCode.BACKEND_UNAVAILABLE,
        f"attention_backend: expected 'auto', 'torch' or 'flashinfer', got {name!r}",
    )


def _flashinfer_available() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


BLAS_MAX_TOKENS = 256  # steps up to this many tokens (decode, CUDA graph buckets) run cuBLASLt


class ModelWrapper:
    def __init__(self, model: CausalLM, cfg: ModelConfig, backend: AttentionBackend,
                 device: torch.device, dtype: torch.dtype, *, cuda_graphs: bool = True,
                 max_graph_batch: int = 256, kernel_config: KernelConfig | None = None):
        """kernel_config: the CUDA kernels' launch constants and switches (None: KernelConfig()'s
        defaults); the kernels object and the graph runner hold it."""
        self.model, self.cfg, self.backend = model, cfg, backend
        self.kernel_config = kernel_config if kernel_config is not None else KernelConfig()
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # "cuda" means the current GPU: name it
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.dtype = device, dtype
        # an FP8 checkpoint's per-layer K / V cache scales (k [L], v [L]) float32, or None
        scales = getattr(model, "checkpoint_kv_scales", None)
        self.checkpoint_kv_scales = None if scales is None else tuple(s.to(device) for s in scales)
        inv_freq = inv_frequencies(cfg.rope, cfg.head_dim).to(device)
        if backend.name == "flashinfer":  # fused kernels come with the CUDA backend
            self.kernels = FlashInferKernels(inv_freq, dtype, cfg.max_position_embeddings, self.kernel_config)
        else:
            self.kernels = TorchKernels(inv_freq, dtype, self.kernel_config)
        # the one K/V writer: the Triton store (and the fused RoPE + store, sharing the kernels' RoPE
        # table) with the CUDA backend, the torch reference otherwise; layers reach it through the backend
        fast = backend.name == "flashinfer"
        self.kv_store = KVStore(triton=fast, rope_table=self.kernels.cos_sin_cache if fast else None,
                                config=self.kernel_config, num_layers=cfg.num_layers, device=device)
        backend.kv_store = self.kv_store
        self.graphs = None
        # the cuBLAS front end of the GEMMs of steps of at most BLAS_MAX_TOKENS tokens (torch.backends.
        # cuda.preferred_blas_library), set for the duration of such a forward only. cuBLASLt:
        # measured on an H100, its skinny decode GEMMs are as fast or faster (Llama-3-8B down_proj
        # at batch 32: 42.8 vs 45.8 us; with LoRA's A rows folded in: 45.2 vs 52.9 us; decode step
        # at batch 32 @ 512: 7.25 vs 7.46 ms), its prefill GEMMs slower (4k tokens: 105.9 vs 104.8
        # ms). TEXT_GENERATOR_BLAS=cublas (or "default": torch's own choice) overrides it (A/B).
        blas = os.environ.get("TEXT_GENERATOR_BLAS", "cublaslt")
        self.blas = None if device.type != "cuda" or blas == "default" else blas
        self._planned = None  # CUDA event after the last eager step's plan copies
        # graphs need the K/V store kernel that skips the -1 slots of padding rows (Triton);
        # under TP they capture the NCCL collectives too (every rank captures and replays the
        # same buckets, since every rank makes the same calls)
        if cuda_graphs and backend.supports_cuda_graphs and self.kv_store.graph_safe:
            from model_wrapper.cuda_graph import DecodeGraphRunner

            self.graphs = DecodeGraphRunner(self, max_batch=max_graph_batch, config=self.kernel_config)
        self._warm_fp8_block_gemm()

    @classmethod
    def from_pretrained(cls, path: str, *, device=None, dtype=None, attention_backend: str = "auto",
                        cuda_graphs: bool = True, max_graph_batch: int = 256, tp_group: TPGroup | None = None,
                        kernel_config: KernelConfig | None = None, progress: bool = True,
                        quantization: str | None = None):
        # quantization="fp8": a float checkpoint quantized to block FP8 while it loads (online_fp8.py)
        cfg = with_quantization(ModelConfig.from_pretrained(path), quantization)
        device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = resolve_dtype(dtype, cfg, device)
        tp = tp_group if tp_group is not None else TPGroup.single()
        model = load_model(path, cfg, dtype=dtype, device=device, tp=tp, progress=progress)
        backend = make_backend(attention_backend, cfg, device, dtype, model.shard)
        logger.info("loaded {} ({} layers) on {} as {}, attention backend {}, tensor parallel rank {} of {}",
                    cfg.architecture, cfg.num_layers, device, dtype, backend.name, tp.rank, tp.world_size)
        wrapper = cls(model, cfg, backend, device, dtype, cuda_graphs=cuda_graphs, max_graph_batch=max_graph_batch,
                      kernel_config=kernel_config)
        wrapper.load_checkpoint_kv_scales()
        return wrapper

    # -- FP8 KV caches: per-layer K and V scales (attention/kv_store.py) ---------------------------
    @property
    def kv_scales(self) -> torch.Tensor:
        """[2, num_layers] float32 on the device: row 0 the K scales, row 1 the V scales an FP8
        (e4m3) cache is written and read with (ones by default; a 16-bit cache ignores them)."""
        return self.kv_store.scales

    def load_checkpoint_kv_scales(self) -> None:
        """Take the checkpoint's K/V scales where the loader found some (checkpoint_kv_scales:
        (k [L], v [L]) float32, or None / absent: keep the current ones)."""
        ckpt = getattr(self, "checkpoint_kv_scales", None)
        if ckpt is None:
            return
        L = self.cfg.num_layers
        for name, s in zip(("k_scale", "v_scale"), ckpt):
            s = torch.as_tensor(s, dtype=torch.float32).flatten()
            if s.numel() != L:
                raise ModelLoadError(ModelErrorCode.MISSHAPEN_TENSOR,
                                     f"{name}: expected one scale per layer ({L}), got {s.numel()}")
            if not bool((torch.isfinite(s) & (s > 0)).all()):
                raise ModelLoadError(ModelErrorCode.NONFINITE_WEIGHT,
                                     f"{name}: expected positive finite scales, got {s.tolist()}")
        self.set_kv_scales(*ckpt)

    def set_kv_scales(self, k_scales, v_scales) -> None:
        """Per-layer K and V scales ([num_layers] positive finite floats each, checked by the caller:
        TextGenerator.set_kv_scales), in place; captured graphs are dropped (FlashInfer's graph
        wrappers take the scales as host floats at capture). K/V already in an FP8 cache were
        written with the old scales: write them again (or start with a new cache)."""
        self.kv_store.set_scales(k_scales, v_scales)
        if self.graphs is not None:
            self.graphs.drop()

    def set_kernel_config(self, config: KernelConfig) -> None:
        """Run the following steps with another KernelConfig (a benchmark's variant): the kernels and
        the graph runner take it, and captured graphs are dropped (captured again on their next use)."""
        self.kernel_config = config
        self.kernels.config = config
        self.kv_store.config = config
        if self.graphs is not None:
            self.graphs.config = config
            self.graphs.drop()
        self._warm_fp8_block_gemm()

    def _warm_fp8_block_gemm(self) -> None:
        """FlashInfer's DeepGEMM block-FP8 GEMM (KernelConfig.fp8_block_gemm_backend) built, checked and
        its small sizes compiled now rather than in the first steps (kernels/fp8_deepgemm.warm)."""
        if self.device.type == "cuda":
            from model_wrapper.kernels import fp8_deepgemm

            fp8_deepgemm.warm(self.model, self.kernel_config, self.device, self.dtype)

    @property
    def tp(self) -> TPGroup:
        return self.model.tp

    @property
    def shard(self) -> TPShard:
        """This rank's sizes: local q / kv heads, intermediate and vocab slice (the model's at TP 1)."""
        return self.model.shard

    def enable_lora(self, manager) -> None:
        """Run `manager`'s adapters (an adapters.LoraManager) in this model from now on.

        Wraps every decoder layer's projection in adapters' LoraLinear (once; a later manager
        reuses the wrappers: they read the step's adapters from its ForwardBatch); where decode
        CUDA graphs run and there is no tensor parallelism, folds the manager's A stacks into the
        base weights (LoraManager.fold_into: row-parallel outputs are all-reduced, which wants
        contiguous tensors, not the folded GEMMs' strided views); and hands the manager to the
        graphs, which also drops graphs captured before (they hold the weights' old storage).
        """
        from adapters import LoraLinear

        def wrap(proj, layer: int, name: str):
            return proj if isinstance(proj, LoraLinear) else LoraLinear(proj, layer, name)

        self.model.wrap_projections(wrap)
        if self.graphs is not None and not self.tp.enabled:
            manager.fold_into(self.lora_linears())
        if self.graphs is not None:
            self.graphs.attach_lora(manager)

    def has_fp8_projections(self) -> bool:
        """Whether a decoder projection keeps FP8 weights (an FP8 checkpoint on CUDA; on the CPU
        they are dequantized at load), which LoRA's fold cannot extend with A rows."""
        return any(lin.method.name == "fp8" for lin in self.lora_linears().values())

    def lora_linears(self) -> dict:
        """{(layer, fused module): Linear} of the projections LoRA adapts (LoraManager.fold_into):
        the base linears, under their wrappers where enable_lora put them."""
        out = {}
        for key, (parent, attr) in self.model.projections().items():
            p = getattr(parent, attr)
            out[key] = getattr(p, "base", p)
        return out

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """This rank's cache: its own kv heads (all of them without tensor parallelism)."""
        return KVCacheSpec(self.cfg.num_layers, self.shard.num_kv_heads, self.cfg.head_dim, self.dtype)

    def kv_cache_dtypes(self) -> tuple[torch.dtype, ...]:
        """The cache dtypes this model runs: its own dtype, and float8_e4m3fn (FP8 K/V with kv_scales) on the CPU
        (the torch reference dequantizes) and on CUDA GPUs with e4m3 (runs_e4m3: sm89+; the attention kernels
        read e4m3 tiles, which Triton cannot type before sm89)."""
        return (self.dtype, FP8_DTYPE) if self.device.type != "cuda" or runs_e4m3(self.device) else (self.dtype,)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_cache) -> torch.Tensor:
        """-> float32 logits [num_out, vocab_size] on the model's device; with batch.hidden_layers,
        (logits, hidden [num_out, len(hidden_layers), hidden_size]) (CausalLM.forward); steps the
        graph runner takes replay CUDA graphs (hidden states included), the others run eagerly."""
        if self.blas is None or batch.input_ids.shape[0] > BLAS_MAX_TOKENS:
            return self._forward(batch, kv_cache)
        prev = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(self.blas)
        try:
            return self._forward(batch, kv_cache)
        finally:
            torch.backends.cuda.preferred_blas_library(prev)

    def _forward(self, batch: ForwardBatch, kv_cache) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(batch, kv_cache):
            return self.graphs.run(batch, kv_cache)
        batch.ensure_lora()
        if self._planned is not None:
            # A caller may run ahead of the device (an engine that does not wait for the last
            # step's tokens): the attention plan refills host buffers whose copies to the device
            # the previous step enqueued; wait until those copies ran (early in that step).
            self._planned.synchronize()
        self.backend.kv_cache_dtype = kv_cache[0][0].dtype  # an FP8 cache plans other kernels
        self.backend.plan(batch)
        if self.device.type == "cuda":
            if self._planned is None:
                self._planned = torch.cuda.Event()
            self._planned.record()
        return self.model(batch, kv_cache, self.backend, self.kernels)
