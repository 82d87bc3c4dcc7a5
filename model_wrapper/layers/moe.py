"""Mixture-of-experts MLP: a router picks top_k experts per token; their outputs, weighted, are summed.

    x [T, H] --gate--> router logits [T, E] --softmax (fp32)--> top_k --(renormalise)--> w [T, k], ids [T, k]
    for each expert e with tokens:  y[t] += w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))   (ids[t, j] = e)
    shared expert (Qwen2-MoE):      y    += sigmoid(shared_gate(x)) * shared_mlp(x)

The experts of a layer are stacked (the loader fills them from the checkpoint's per-expert tensors):
gate_up_proj [E, 2I, H] (gate rows first, as the dense MLP's gate_up_proj) and down_proj [E, H, I]. The
arithmetic is transformers' (Qwen3MoeExperts / MixtralExperts): experts visited in ascending order, each
expert's weighted output rounded to the model dtype and index-added, so bf16 results match it bit for bit
on the CPU. Mixtral keeps the routing weights in fp32 (`fp32_weights`); the Qwen families round them to
the model dtype first.

Under tensor parallelism each rank holds the intermediate slice [r * I/W, (r + 1) * I/W) of every expert
(and of the shared expert): gate_up rows and down columns, like the dense MLP's column / row parallel
pair; the router and the shared-expert gate are replicated. The weighted partial sums of all experts and
the shared expert are all-reduced once. A block-FP8 checkpoint's experts are cut at 128-column blocks instead
(parallel.block_split: uneven slices, and a rank may hold none, an expert width of 0, adding zero).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model_wrapper.kernels.fp8_reference import QuantizedActivation
from model_wrapper.layers.norm import PendingNorm


@dataclass(frozen=True)
class MoESpec:
    """What a sparse MLP layer looks like (sizes are this rank's under tensor parallelism).

    num_experts:       E, experts per layer
    top_k:             experts per token
    intermediate_size: I, each expert's intermediate width
    norm_topk_prob:    renormalise the top_k probabilities to sum to 1
    fp32_weights:      keep the routing weights in fp32 (Mixtral) instead of the model dtype
    shared_intermediate_size: the shared expert's width (Qwen2-MoE), or None
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    fp32_weights: bool = False
    shared_intermediate_size: int | None = None


def route(router_logits: torch.Tensor, spec: MoESpec) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k], expert ids [T, k] int64), transformers' routing (on CUDA the
    same in one kernel: kernels/moe_route.py)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, spec.top_k, dim=-1)
    if spec.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if not spec.fp32_weights:
        weights = weights.to(router_logits.dtype)
    return weights, ids


def experts_reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                      down: torch.Tensor) -> torch.Tensor:
    """x [T, H], weights / ids [T, k], gate_up [E, 2I, H], down [E, H, I] -> sum over each token's experts
    of weight * expert(x), [T, H] in x's dtype. The readable specification: one pass per expert that has
    tokens (a host round trip per layer for the counts; the CUDA path sorts on the device instead)."""
    out = torch.zeros_like(x)
    counts = torch.bincount(ids.flatten(), minlength=gate_up.shape[0]).tolist()
    for e, n in enumerate(counts):
        if n == 0:
            continue
        tok, slot = torch.where(ids == e)  # a token picks an expert at most once: rows are distinct
        gate, up = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[e]) * weights[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


FP8_GROUP = 128  # columns per scale of block-wise FP8 experts (one scale per row and group; the kernels' too)


def dequantize_experts(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Block-wise FP8 experts back to the model dtype: w [E, rows, cols] e4m3, scale [E, rows, ceil(cols / 128)]
    float32 -> w * scale of its row and 128-column group, rounded to dtype once (as the kernels do per tile)."""
    full = scale.to(torch.float32).repeat_interleave(FP8_GROUP, dim=-1)[..., :w.shape[-1]]
    return (w.to(torch.float32) * full).to(dtype)


class Experts(nn.Module):
    """The stacked expert weights of one layer: gate_up_proj [E, 2I, H], down_proj [E, H, I].

    From an FP8 checkpoint on CUDA (model_wrapper/fp8_weights.py; block, per-channel or per-tensor scales)
    both are float8_e4m3fn and gate_up_proj_scale [E, 2I, ceil(H/128)] / down_proj_scale [E, H, ceil(I/128)]
    hold a float32 scale per row and 128-column group (a channel / tensor scale repeated over the groups);
    otherwise those are None (weights in the model dtype)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.gate_up_proj_scale = self.down_proj_scale = None


class SharedExpert(nn.Module):
    """Qwen2-MoE's always-on expert: a dense SiLU MLP (gate_up fused like the dense MLP's)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)


class SparseMoE(nn.Module):
    """A layer's sparse MLP: router (gate), stacked experts, optional shared expert and its gate.

    Parameter names (what the loader fills): gate.weight [E, H]; experts.gate_up_proj [E, 2I, H];
    experts.down_proj [E, H, I]; shared_expert.{gate_up_proj, down_proj}.weight; shared_expert_gate.weight [1, H].
    Its call is the dense MLP's (layers/mlp.py) but it takes no tail: the norm before it must have
    finished its rows (takes_row_scale is False) and it hands none on.
    """

    takes_row_scale = False
    input_quant_writes_x = True  # (a quantized input comes with its normed rows: the router's and shared expert's)

    def __init__(self, spec: MoESpec, hidden_size: int, tp=None):
        super().__init__()
        self.spec = spec
        self.tp = tp
        self.gate = nn.Linear(hidden_size, spec.num_experts, bias=False)
        self.experts = Experts(spec.num_experts, hidden_size, spec.intermediate_size)
        self.shared_expert = self.shared_expert_gate = None
        if spec.shared_intermediate_size:
            self.shared_expert = SharedExpert(hidden_size, spec.shared_intermediate_size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def takes_norm(self, h: torch.Tensor, kernels) -> bool:
        """Whether the router's kernel takes the norm before it (a layers/norm.PendingNorm) at rows like h
        (KernelConfig.gemv_add_norm_router where the router and the routing are one kernel)."""
        return kernels.router_takes_norm(h, self.gate.weight)

    def input_quant(self, rows: int, dtype: torch.dtype, device: torch.device, kernels) -> int | None:
        """The group (128) in which the norm before may quantize x for the experts (kernels.moe_input_quant: W8A8
        FP8 experts past the decode path, KernelConfig.moe_w8a8_norm_quant), or None: a plain x."""
        ex = self.experts
        if ex.gate_up_proj_scale is None or not ex.down_proj.shape[-1]:
            return None
        return kernels.moe_input_quant(rows, self.spec.top_k, self.spec.num_experts)

    def forward(self, x, batch, kernels, scale=None, fuse_tail: bool = False):
        """x [T, H] (the post-attention norm's output; a PendingNorm where takes_norm said so: the router's
        kernel normalizes the rows and writes them for the experts; or a QuantizedActivation with its rows, .x,
        where input_quant asked for one: the experts' W8A8 GEMMs take it) -> ([T, H], None). Under tensor
        parallelism the ranks' partial sums (their intermediate slices) are all-reduced once."""
        if scale is not None:
            raise RuntimeError("a sparse MLP takes no row scale: the norm before it must finish its rows")
        x_quant = None
        if isinstance(x, QuantizedActivation):
            x_quant, x = x, x.x
        if isinstance(x, PendingNorm):
            weights, ids, x = kernels.moe_router_norm(x, self.gate.weight, self.spec)
        else:
            # kernels.moe_router: the router's projection (a model projection: the GEMV at 1-2 tokens on CUDA) and
            # the routing (on CUDA one kernel, kernels/moe_route.py; at 1-2 tokens both in one), then the experts
            weights, ids = kernels.moe_router(x, self.gate.weight, self.spec)
        ex = self.experts
        scales = {} if ex.gate_up_proj_scale is None else dict(gate_up_scale=ex.gate_up_proj_scale,
                                                               down_scale=ex.down_proj_scale)
        if x_quant is not None:
            scales["x_quant"] = x_quant
        if ex.down_proj.shape[-1]:
            y = kernels.moe_experts(x, weights, ids, ex.gate_up_proj, ex.down_proj, **scales)
        else:  # a TP rank holding none of the experts' 128-column blocks (parallel.block_split): adds nothing
            y = torch.zeros_like(x)
        if self.shared_expert is not None:
            s = self.shared_expert
            shared = kernels.linear(kernels.gate_up_silu(x, s.gate_up_proj.weight), s.down_proj.weight)
            y = y + torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * shared
        if self.tp is not None and self.tp.enabled:
            y = self.tp.all_reduce(y)
        return y, None
