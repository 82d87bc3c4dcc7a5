"""The EAGLE-3 draft head: one decoder layer over [token embedding ; a feature of the target].

The feature g of a position is either `fc` over three of the target's hidden states at that
position (concatenated, [T, 3 * target_hidden]; forward_tensor(output_hidden_states=...) gives
them), or, for a position the head drafted itself, the head's own pre-norm output there. Per
token t at position p (the draft entry p pairs the feature of p with the token at p + 1):

    g      = fc(cat(h_a, h_b, h_c))  or the previous draft step's pre-norm output     [T, H]
    x      = cat(input_layernorm(embed(t)), hidden_norm(g))                           [T, 2H]
    a      = g + o_proj(attention(qkv_proj(x)))          RoPE at p, K/V in a one-layer paged cache
    out    = a + mlp(post_attention_layernorm(a))        pre-norm output: the next step's g
    logits = lm_head(norm(out))                          [T, draft_vocab]; draft id d = target id d + d2t[d]

Parameter names follow the public checkpoints (SafeAILab's EAGLE-3, as vLLM and SGLang load
them): fc, midlayer.{input_layernorm, hidden_norm, self_attn, post_attention_layernorm, mlp},
norm, lm_head, d2t; our midlayer fuses q/k/v into qkv_proj and gate/up into gate_up_proj (the
loader, model_wrapper/eagle3_loader.py, fills them). The head runs under a ModelWrapper of its
own (its attention backend and kernels); the step's input feature comes in batch.extras.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model_wrapper.config import ModelConfig
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.layers.linear import Linear
from model_wrapper.layers.mlp import DenseMLP
from model_wrapper.layers.norm import RMSNorm
from model_wrapper.models.decoder import Attention
from model_wrapper.parallel import TPGroup, TPShard

FEATURE = "eagle3_feature"  # batch.extras key: the step's input feature, see Eagle3Head.forward


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over [normed embedding ; normed feature] (2H wide)."""

    def __init__(self, cfg: ModelConfig, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 0, shard, tp)
        attn = self.self_attn  # its projections take the 2H concatenation
        attn.qkv_proj = Linear(2 * cfg.hidden_size, attn.q_size + 2 * attn.kv_size, bias=cfg.qkv_bias)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DenseMLP(cfg, shard, tp)


class Eagle3Head(nn.Module):
    """Owns the head's weights and the draft -> target vocabulary map (d2t [draft_vocab] int64).

    cfg: the head's own decoder shape (one layer; vocab_size = the target's vocabulary, which its
    embedding covers). target_hidden: the target's hidden size (fc takes 3 of its states).
    embed: the target's embedding weight [vocab, H] where the checkpoint has none of its own (the
    usual case), else None and embed_tokens is a parameter of the head.
    """

    def __init__(self, cfg: ModelConfig, target_hidden: int, draft_vocab: int, embed: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.tp = TPGroup.single()
        self.shard = TPShard.of(cfg, self.tp)
        self.target_hidden, self.draft_vocab = target_hidden, draft_vocab
        self.fc = Linear(3 * target_hidden, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg, self.shard, self.tp)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        if embed is None:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self._shared_embed = None
        else:
            self.embed_tokens = None
            self._shared_embed = embed.detach()  # the target's storage, not a parameter of the head

    @property
    def graph_inputs(self) -> dict:
        """The per-token float input a CUDA graph of the head's step holds a static buffer for
        (model_wrapper/cuda_graph.py): the feature g [T, H] in batch.extras[FEATURE]."""
        return {FEATURE: (self.cfg.hidden_size, self.fc.weight.dtype)}

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] (target vocabulary) -> [T, H]."""
        if self.embed_tokens is not None:
            return self.embed_tokens(ids)
        return F.embedding(ids, self._shared_embed)

    def fuse(self, states: torch.Tensor, kernels) -> torch.Tensor:
        """The target's three hidden states [T, 3, target_hidden] (any float dtype) -> features [T, H]."""
        return self.fc.project(states.reshape(states.shape[0], -1).to(self.fc.weight.dtype), kernels)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (d + d2t[d])."""
        return draft_ids + self.d2t[draft_ids]

    def forward(self, batch: ForwardBatch, kv_cache, backend, kernels):
        """One draft step over batch's tokens; batch.extras[FEATURE] is their features g [T, H].

        kv_cache: [(k, v)], the head's one layer. -> (draft logits [num_out, draft_vocab] float32,
        pre-norm outputs [num_out, H]) for the rows of batch.lm_head_indices (all if None)."""
        g = batch.extras[FEATURE]
        layer = self.midlayer
        rope = kernels.rope_tables(batch.positions)
        x = torch.cat([kernels.rms_norm(self.embed(batch.input_ids), layer.input_layernorm.weight,
                                        layer.input_layernorm.eps),
                       kernels.rms_norm(g, layer.hidden_norm.weight, layer.hidden_norm.eps)], dim=-1)
        o, _ = layer.self_attn(x, rope, batch, kv_cache[0], backend, kernels)
        x, a, _ = layer.post_attention_layernorm.add(o, g.clone(), kernels)  # a = g + o (in place on the clone)
        m, _ = layer.mlp(x, batch, kernels)
        out = a + m
        if batch.lm_head_indices is not None:
            out = out.index_select(0, batch.lm_head_indices)
        normed = kernels.rms_norm(out, self.norm.weight, self.norm.eps)
        return self.lm_head.project(normed, kernels).float(), out
