"""The elementwise kernels of the decoder, in two implementations with one interface.

TorchKernels is the reference: the exact arithmetic of transformers' Llama-family modules (fp32
RMSNorm statistics, cos/sin rounded to the model dtype). FlashInferKernels runs the same math
as fused CUDA kernels (RMSNorm, residual-add + RMSNorm in place, RoPE in place from a float32
cos/sin table, a GEMV for steps of one or two tokens, a skinny tensor-core GEMM for 3-64, both
with SiLU-and-mul fused for gate_up); the GPU tests hold it to the torch path within bf16
bounds. The model wrapper picks one at load time; layers call `kernels.<op>` (the
projections `kernels.linear`) and never branch on the device themselves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_wrapper.kernels.config import KernelConfig
from model_wrapper.layers.moe import dequantize_experts, experts_reference, route
from model_wrapper.layers.norm import PendingNorm
from model_wrapper.layers.norm import rms_norm as _rms_norm_ref


class TorchKernels:
    name = "torch"
    fuses_lora = False  # silu_mul and the K/V store's rope_write accept a deferred LoRA delta (lora=...)
    # add_rms_norm_lora: the o / down LoRA delta, the residual add and RMSNorm column-parallel, the
    # norm's division left to silu_mul / KVStore.rope_write (scale=...) after the next GEMM
    fuses_norm_scale = False

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype, config: KernelConfig | None = None):
        self.inv_freq = inv_freq  # [head_dim // 2] float32
        self.dtype = dtype
        self.config = config if config is not None else KernelConfig()  # launch constants (CUDA kernels)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, K] -> x @ weight^T (+ bias): the model's projections and lm_head."""
        return F.linear(x, weight, bias)

    def gate_up_silu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, K] -> silu(gate) * up of x @ gate_up^T (+ bias), [T, n]: the MLP's first half
        without LoRA (weight [2n, K], gate rows first)."""
        return self.silu_mul(self.linear(x, weight, bias))

    def gemv_takes_norm(self, x: torch.Tensor, weight: torch.Tensor, silu: bool) -> bool:
        """Whether linear(x) (silu: gate_up_silu) takes a layers/norm.PendingNorm for rows like x: never here."""
        return False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [..., d] -> weight * x / rms(x), statistics in fp32, result in x's dtype."""
        return _rms_norm_ref(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        """-> (rms_norm(residual + x), residual + x): the pre-norm residual stream in one call."""
        residual = residual + x
        return self.rms_norm(residual, weight, eps), residual

    def rms_norm_fp8(self, x, residual, weight, eps, group, write_x: bool = False):
        """(residual + x, in place, where residual is given) normed and quantized to e4m3 per token
        and `group` columns in one kernel -> a QuantizedActivation (kernels/fp8_act.py; write_x: it also
        holds the normed rows, .x), or None where these kernels do not fuse it (here: never; the
        projection then quantizes x itself)."""
        return None

    def rope_tables(self, positions: torch.Tensor):
        """Per-step rotary state, built once and shared by every layer: (cos, sin) [T, head_dim]."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype), positions

    def rope(self, q: torch.Tensor, k: torch.Tensor, tables) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hk, D] -> rotated (neox / rotate_half form)."""
        cos, sin, _ = tables
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def silu_mul(self, gate_up: torch.Tensor, lora=None, scale=None) -> torch.Tensor:
        _no_lora(self, lora, scale)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def moe_route(self, logits: torch.Tensor, spec) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [T, E] -> (weights [T, k], expert ids [T, k] int64): layers/moe.route (a MoESpec)."""
        return route(logits, spec)

    def moe_router(self, x, gate_weight, spec) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H], the router's weight [E, H] -> (weights [T, k], expert ids [T, k] int64): the router's
        projection (a model projection: self.linear), then moe_route (a MoESpec)."""
        return self.moe_route(self.linear(x, gate_weight), spec)

    def router_takes_norm(self, x: torch.Tensor, gate_weight: torch.Tensor) -> bool:
        """Whether moe_router_norm takes a layers/norm.PendingNorm for rows like x: never here."""
        return False

    def moe_input_quant(self, rows: int, top_k: int, num_experts: int) -> int | None:
        """The group (128) in which moe_experts' FP8 experts take x quantized by the norm before it at a step of
        `rows` tokens, or None (here: never)."""
        return None

    def moe_experts(self, x, weights, ids, gate_up, down, gate_up_scale=None, down_scale=None,
                    x_quant=None) -> torch.Tensor:
        """x [T, H], routing weights / expert ids [T, k], stacked experts gate_up [E, 2I, H] and
        down [E, H, I] -> [T, H]: the reference (layers/moe.experts_reference, a pass per expert).
        FP8 experts (e4m3, with float32 scales gate_up_scale [E, 2I, ceil(H / 128)] and down_scale
        [E, H, ceil(I / 128)]) are dequantized to x's dtype first (layers/moe.dequantize_experts).
        x_quant: x quantized by the norm before (moe_input_quant asked for it); unused here."""
        if (gate_up_scale is None) != (down_scale is None):
            raise ValueError("moe_experts: FP8 experts need both gate_up_scale and down_scale, got one")
        if gate_up_scale is not None:
            gate_up = dequantize_experts(gate_up, gate_up_scale, x.dtype)
            down = dequantize_experts(down, down_scale, x.dtype)
        return experts_reference(x, weights, ids, gate_up, down)


def _no_lora(kernels, lora, scale=None) -> None:
    if lora is not None or scale is not None:
        raise RuntimeError(f"{type(kernels).__name__} got a deferred LoRA delta or RowScale but does not fuse one")


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class FlashInferKernels(TorchKernels):
    name = "flashinfer"

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype, max_positions: int,
                 config: KernelConfig | None = None):
        super().__init__(inv_freq, dtype, config)
        import flashinfer

        self._fi = flashinfer
        try:
            from model_wrapper.kernels import ops as triton_ops
        except ImportError:  # no Triton: torch's silu and mul
            triton_ops = None
        self._triton = triton_ops
        self.fuses_lora = self.fuses_norm_scale = triton_ops is not None
        pos = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
        freqs = pos[:, None] * inv_freq[None, :]
        # [P, D] fp32, cos half then sin half: rope() here and the K/V store's fused RoPE (KVStore.rope_table)
        self.cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()

    def linear(self, x, weight, bias=None):
        """Steps of one or two tokens: Triton's GEMV, which reads the weights while the kernel
        before it drains (kernels/gemv.py); of 3-64 tokens on Hopper: Triton's skinny
        tensor-core GEMM (kernels/gemm.py); otherwise cuBLAS. x a PendingNorm (gemv_takes_norm):
        the GEMV with the add + RMSNorm in its prologue."""
        if isinstance(x, PendingNorm):
            return self._triton.gemv(x.h, weight, bias, cfg=self.config, add_norm=x.add_norm())
        if self._triton is not None:
            cfg = self.config
            if self._triton.gemv_fits(x, weight, cfg):
                return self._triton.gemv(x, weight, bias, cfg=cfg)
            if self._triton.skinny_fits(x, weight, cfg):
                return self._triton.skinny_gemm(x, weight, bias, cfg=cfg)
        return F.linear(x, weight, bias)

    def gate_up_silu(self, x, weight, bias=None):
        """Where the GEMV or the skinny GEMM takes the step, one kernel: silu(gate) * up in its
        epilogue, each product rounded first as in the unfused pair; otherwise GEMM, then silu_mul.
        x a PendingNorm (gemv_takes_norm): the GEMV with the add + RMSNorm in its prologue too."""
        t = self._triton
        if isinstance(x, PendingNorm):
            return t.gemv(x.h, weight, bias, silu=True, cfg=self.config, add_norm=x.add_norm())
        if t is not None:
            cfg = self.config
            if t.gemv_fits(x, weight, cfg) and x.shape[1] <= cfg.gemv_max_k // 2:  # holds a gate and an up row
                return t.gemv(x, weight, bias, silu=True, cfg=cfg)
            if t.skinny_fits(x, weight, cfg):
                return t.skinny_gemm(x, weight, bias, silu=True, cfg=cfg)
            if t.wide_silu_fits(x, weight, cfg):
                return t.wide_gate_up_silu(x, weight, bias)
        return super().gate_up_silu(x, weight, bias)

    def gemv_takes_norm(self, x, weight, silu):
        """config.adds_norm (qkv; silu: gate_up) where the GEMV takes x (kernels/gemv.py; gate_up: a gate
        and an up row a program)."""
        cfg = self.config
        return (cfg.adds_norm(x.shape[0], "gate_up" if silu else "qkv") and self._triton is not None
                and self._triton.gemv_fits(x, weight, cfg) and (not silu or x.shape[1] <= cfg.gemv_max_k // 2))

    def rms_norm(self, x, weight, eps):
        if x.dim() == 2:
            return self._fi.rmsnorm(x, weight, eps)
        return self._fi.rmsnorm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    def add_rms_norm(self, x, residual, weight, eps):
        if self._triton is not None and self._triton.add_rms_norm_fits(x, residual, self.config):
            self._triton.add_rms_norm(x, residual, weight, eps, self.config)  # lets the GEMV after it launch at once
        else:
            self._fi.fused_add_rmsnorm(x, residual, weight, eps)  # residual += x; x = norm(residual)
        return x, residual

    def rope_tables(self, positions):
        return positions

    def rms_norm_fp8(self, x, residual, weight, eps, group, write_x=False):
        """Triton's add + RMSNorm + e4m3 quantization (kernels/fp8_act.py) where it takes x; else None."""
        if self._triton is None:
            return None
        from model_wrapper.kernels.fp8_act import add_rms_norm_fp8, norm_fp8_fits

        if not norm_fp8_fits(x, group) or (residual is not None and residual.stride(-1) != 1):
            return None
        return add_rms_norm_fp8(x, residual, weight, eps, group, write_x, self.config)

    def silu_mul(self, gate_up, lora=None, scale=None):
        """scale (a RowScale, with lora): gate_up projects add_rms_norm_lora's undivided rows."""
        if self._triton is None:
            return super().silu_mul(gate_up, lora, scale)
        if lora is not None:
            return self._triton.silu_and_mul_lora(gate_up, lora, scale, self.config)
        if scale is not None:
            raise RuntimeError("silu_mul: a RowScale comes only with the gate_up LoRA delta")
        return self._triton.silu_and_mul(gate_up, self.config)

    def add_rms_norm_lora(self, x, residual, weight, eps, lora):
        """add_rms_norm with x's deferred LoRA delta `lora` (o or down) added first, in one column-
        parallel kernel that leaves the division by rms to the kernel after the next GEMM:
        -> (weight * (residual + x + delta), residual + x + delta, RowScale), x and residual in place."""
        scale = self._triton.add_lora_rms_norm(x, residual, weight, eps, lora, self.config)
        return x, residual, scale

    def moe_route(self, logits, spec):
        """Softmax, top-k, renormalisation and cast in one Triton kernel (kernels/moe_route.py; exact
        ties to the lower expert index); without Triton or with config.moe_fused_route off, torch's ops."""
        if self._triton is None or not self.config.moe_fused_route:
            return super().moe_route(logits, spec)
        from model_wrapper.kernels.moe_route import moe_route

        return moe_route(logits, spec.top_k, spec.norm_topk_prob, spec.fp32_weights, self.config)

    def moe_router(self, x, gate_weight, spec):
        """At the GEMV's step sizes, the router's projection and the routing in one Triton kernel
        (kernels/moe_route.moe_router_route; config.moe_fused_router, with moe_fused_route); else the GEMV /
        GEMM, then moe_route."""
        if self._triton is not None and self.config.moe_fused_route:
            from model_wrapper.kernels.moe_route import moe_router_route, router_route_fits

            if router_route_fits(x, gate_weight, self.config):
                w, ids, _ = moe_router_route(x, gate_weight, spec.top_k, spec.norm_topk_prob, spec.fp32_weights,
                                             self.config)
                return w, ids
        return super().moe_router(x, gate_weight, spec)

    def router_takes_norm(self, x, gate_weight):
        """config.adds_norm(router) where moe_router runs the router and the routing in one kernel."""
        cfg = self.config
        if self._triton is None or not (cfg.moe_fused_route and cfg.adds_norm(x.shape[0], "router")):
            return False
        from model_wrapper.kernels.moe_route import router_route_fits

        return router_route_fits(x, gate_weight, cfg)

    def moe_router_norm(self, x: PendingNorm, gate_weight, spec):
        """moe_router of a PendingNorm (router_takes_norm said so): the residual add + RMSNorm, the router's
        projection and the routing in one kernel (kernels/moe_route.moe_router_route_norm) -> (weights [T, k],
        ids [T, k], the normalized rows [T, H] for the experts)."""
        from model_wrapper.kernels.moe_route import moe_router_route_norm

        return moe_router_route_norm(x.h, gate_weight, spec.top_k, spec.norm_topk_prob, spec.fp32_weights,
                                     x.add_norm(), self.config)

    def moe_experts(self, x, weights, ids, gate_up, down, gate_up_scale=None, down_scale=None, x_quant=None):
        """Triton's fused MoE (kernels/moe.py: a GEMV per token-expert pair for decode steps, else
        pairs sorted per expert on the device and grouped GEMMs; FP8 experts dequantized in registers;
        no host sync, so decode graphs capture it); without Triton the reference. x_quant: x quantized
        per token and 128 columns by the norm before (moe_input_quant), which the W8A8 GEMMs take as it is."""
        if self._triton is None:
            return super().moe_experts(x, weights, ids, gate_up, down, gate_up_scale, down_scale)
        from model_wrapper.kernels.moe import fused_moe

        return fused_moe(x, weights, ids, gate_up, down, self.config, gate_up_scale, down_scale, x_quant)

    def moe_input_quant(self, rows: int, top_k: int, num_experts: int) -> int | None:
        """128 where fused_moe runs FP8 experts' W8A8 small tiles at this step of `rows` tokens and
        KernelConfig.moe_w8a8_norm_quant lets the norm before quantize their input (kernels/moe.takes_quantized_x);
        else None."""
        if self._triton is None:
            return None
        from model_wrapper.kernels.moe import takes_quantized_x

        return takes_quantized_x(rows, top_k, num_experts, self.config)

    def rope(self, q, k, positions):
        T, D = q.shape[0], q.shape[-1]
        q2, k2 = q.reshape(T, -1), k.reshape(T, -1)
        self._fi.apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, D, self.cos_sin_cache, is_neox=True)
        return q2.view(q.shape), k2.view(k.shape)
