"""The decoder layer's MLP, chosen per layer by make_mlp: DenseMLP, or a mixture of experts (layers/moe.py).

An MLP is the only part of the model that knows its projections (gate_up_proj, down_proj); the
layer calls `h, tail = mlp(x, batch, kernels, scale, fuse_tail)` and passes tail to its next norm.
"""

from __future__ import annotations

import torch
from torch import nn

from model_wrapper.config import ModelConfig
from model_wrapper.layers.linear import GateUpLinear, RowParallelLinear
from model_wrapper.layers.moe import MoESpec, SparseMoE
from model_wrapper.parallel import TPGroup, TPShard


class DenseMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused in one [gate | up] projection.

    Under TP gate_up is column-parallel (this rank's intermediate slice) and down row-parallel.
    """

    takes_row_scale = True  # gate_up's SiLU-and-mul can finish the rows of a norm that took a tail

    def __init__(self, cfg: ModelConfig, shard: TPShard, tp: TPGroup):
        super().__init__()
        inter = shard.intermediate_size
        self.gate_up_proj = GateUpLinear(cfg.hidden_size, 2 * inter, bias=cfg.mlp_bias)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias=cfg.mlp_bias, tp=tp)

    def takes_norm(self, h: torch.Tensor, kernels) -> bool:
        """Whether gate_up's kernel takes the norm before it (layers/norm.PendingNorm) for input rows h
        (False for a wrapper of it without the call: LoRA)."""
        takes = getattr(self.gate_up_proj, "takes_norm", None)
        return takes is not None and takes(h, kernels)

    def input_quant(self, rows: int, dtype: torch.dtype, device: torch.device, kernels) -> int | None:
        """gate_up's input_quant (FP8 block weights at prefill sizes: the norm before may hand over a
        QuantizedActivation), or None (a plain x; also for a wrapper of it without the call: LoRA)."""
        quant = getattr(self.gate_up_proj, "input_quant", None)
        return None if quant is None else quant(rows, dtype, device, kernels)

    def forward(self, x: torch.Tensor, batch, kernels, scale=None, fuse_tail: bool = False):
        """x [T, hidden] (or a PendingNorm, where takes_norm said so) -> (y [T, hidden], down's tail
        for the next norm or None).

        scale: the norm before took a tail and left x's rows undivided; gate_up's SiLU-and-mul
        divides them. fuse_tail: the next norm can take down's tail."""
        if scale is None and isinstance(self.gate_up_proj, GateUpLinear):  # not wrapped (LoRA)
            act = self.gate_up_proj.silu(x, batch, kernels, into=self.down_proj)  # down's input quantized there
        else:
            act = self.gate_up_proj.silu(x, batch, kernels, scale)
        return self.down_proj(act, batch, kernels, fuse_tail)


def make_mlp(cfg: ModelConfig, layer: int, shard: TPShard, tp: TPGroup) -> nn.Module:
    """The MLP of decoder layer `layer`: sparse where a mixture-of-experts config says so, else dense."""
    moe = cfg.moe
    if moe is None or not moe.sparse_layers[layer]:
        return DenseMLP(cfg, shard, tp)
    spec = MoESpec(moe.num_experts, moe.top_k, shard.moe_intermediate_size, moe.norm_topk_prob, moe.fp32_weights,
                   shard.shared_intermediate_size)
    return SparseMoE(spec, cfg.hidden_size, tp)
