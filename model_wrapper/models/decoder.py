"""The one decoder all families share: embed -> N x (attention, MLP) -> norm -> lm_head.

Weights are fused where that saves launches (q/k/v in qkv_proj, gate/up in gate_up_proj); the
loader fills the fused tensors from the checkpoint's separate ones. A family changes only the
flags in ModelConfig (biases, q/k norm, per-layer sliding windows). The model owns no cache
bookkeeping: the attention backend writes and reads K/V. Each projection is a Linear
(layers/linear.py) called as `y, tail = proj(x, batch, kernels, fuse_tail)`: where the kernel
after it can finish pending work on y (the fused RoPE + K/V store, the residual add + RMSNorm),
the model says so and hands the projection's tail to that kernel unopened. Under tensor
parallelism (a TPGroup of world > 1, see model_wrapper/parallel.py) each rank builds the layers
with its own sizes (TPShard) and the row-parallel projections, the embedding and lm_head run
their collectives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model_wrapper.config import ModelConfig
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels.fp8_reference import QuantizedActivation
from model_wrapper.layers.linear import Linear, RowParallelLinear
from model_wrapper.layers.mlp import make_mlp
from model_wrapper.layers.norm import RMSNorm
from model_wrapper.parallel import TPGroup, TPShard




class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, cfg.head_dim
        self.q_size = shard.num_heads * cfg.head_dim
        self.kv_size = shard.num_kv_heads * cfg.head_dim
        self.window = cfg.layer_windows[layer] if cfg.layer_windows else None
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, cfg.hidden_size, bias=cfg.o_bias, tp=tp)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.family.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.family.qk_norm else None

    def fuses_rope_store(self, T: int, kv, backend, kernels, lora: bool = False) -> bool:
        """RoPE, the K/V store (and the qkv projection's tail, and Qwen3's q / k norms) in one kernel where
        the K/V store has that path for this step (KVStore.fuses_rope; lora: the step names adapters)."""
        # kernels.dtype: the projection's output dtype, the model's, whatever its weight format (FP8: e4m3)
        return backend.kv_store.fuses_rope(T, kv[0].dtype, kernels.dtype, qk_norm=self.q_norm is not None, lora=lora)

    def forward(self, x, rope, batch: ForwardBatch, kv, backend, kernels, scale=None, fuse_tail: bool = False):
        """x [T, hidden] -> ([T, hidden], o's tail for the next norm or None); writes this step's
        K/V into kv = (k_cache, v_cache). scale: the norm before took a tail and left x's rows
        undivided; the fused RoPE + store kernel divides them. fuse_tail: the next norm can take
        o's tail."""
        T = x.shape[0]
        fused = self.fuses_rope_store(T, kv, backend, kernels, batch.uses_lora)
        qkv, tail = self.qkv_proj(x, batch, kernels, fused)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(T, self.num_heads, self.head_dim)
        if scale is not None and (not fused or tail is None):
            raise RuntimeError("a row scale needs the fused RoPE + store kernel and a tail of the qkv projection")
        qk_norm = None if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        if fused and tail is None and scale is None:  # RoPE, the store and attention in one kernel, where the backend can
            o = backend.rope_attend(self.layer, qkv, kv, self.window, batch, self.num_heads, self.num_kv_heads, qk_norm)
            if o is not None:
                return self.o_proj(o.reshape(T, self.q_size), batch, kernels, fuse_tail)
        # a LoRA step past the kernel's LoRA bound: the projection added its own deltas (tail None), and the
        # kernel's token tiles still take RoPE, the store and the q / k norms
        if fused or (batch.uses_lora and self.fuses_rope_store(T, kv, backend, kernels)):
            backend.kv_store.rope_write(kv, qkv, rope, self.num_heads, self.num_kv_heads, self.head_dim, batch.slots,
                                        lora=tail, scale=scale, layer=self.layer, qk_norm=qk_norm)
            k = k.view(T, self.num_kv_heads, self.head_dim)  # rotated and stored in place
            v = v.view(T, self.num_kv_heads, self.head_dim)
        else:
            k = k.reshape(T, self.num_kv_heads, self.head_dim)
            v = v.reshape(T, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q = kernels.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
                k = kernels.rms_norm(k, self.k_norm.weight, self.k_norm.eps)
            q, k = kernels.rope(q, k, rope)
            backend.kv_store.write(kv, k, v, batch, layer=self.layer)
        # o's input quantized by the attention's split merge where o's e4m3 kernel takes it so (a QuantizedActivation)
        ask = getattr(self.o_proj, "attention_input_quant", None)
        group = (ask(T, q.dtype, q.device, kernels) if ask is not None and not batch.uses_lora
                 and getattr(backend, "quantizes_output", False) else None)
        o = backend.run(self.layer, q, kv[0], kv[1], self.window, batch, k=k, v=v,
                        **({} if group is None else {"quant_group": group}))
        return self.o_proj(o if isinstance(o, QuantizedActivation) else o.reshape(T, self.q_size), batch, kernels,
                           fuse_tail)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, shard, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_mlp(cfg, layer, shard, tp)

    def forward(self, h, residual, rope, batch, kv, backend, kernels, tail=None, norm_tails: bool = False,
                last: bool = False):
        """Pre-norm residual block in (output, residual) form so that the residual add and the
        next norm fuse into one kernel (or into the prologue of the GEMV after it: qkv, the MLP's
        first, RMSNorm.add's `into`): h_out + residual_out (+ the returned tail) is the block's
        true output. -> (h_out, residual_out, the down projection's tail for the next norm or None).

        tail: the previous block's (h lacks it). norm_tails: this step's norms may take the o and
        down tails (CausalLM.forward), except after the last block's down."""
        x, residual, scale = self.input_layernorm.add(h, residual, kernels, tail, into=self.self_attn.qkv_proj)
        h, tail = self.self_attn(x, rope, batch, kv, backend, kernels, scale, norm_tails)
        x, residual, scale = self.post_attention_layernorm.add(h, residual, kernels, tail, into=self.mlp)
        h, tail = self.mlp(x, batch, kernels, scale, norm_tails and not last)
        return h, residual, tail


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.embed_tokens = nn.Embedding(shard.vocab_shard, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, shard, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Parameter names mirror Hugging Face's, but for the fused qkv_proj and gate_up_proj.

    cfg is the global model; under a TPGroup of world > 1 every sharded parameter has this
    rank's size (shard = TPShard.of(cfg, tp)) and the logits are still the full vocabulary.
    """

    def __init__(self, cfg: ModelConfig, tp: TPGroup | None = None):
        super().__init__()
        self.cfg = cfg
        self.tp = tp if tp is not None else TPGroup.single()
        self.shard = TPShard.of(cfg, self.tp)
        self.model = DecoderModel(cfg, self.shard, self.tp)
        self.lm_head = Linear(cfg.hidden_size, self.shard.vocab_shard, bias=False)

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch, kv_cache, backend, kernels):
        """-> float32 logits [num_out, vocab] for batch.lm_head_indices (all tokens if None); with
        batch.hidden_layers set, (logits, hidden [num_out, len(hidden_layers), hidden] float32):
        hidden[:, j] is state hidden_layers[j] of those rows (0 = embeddings, i = input of layer i,
        num_layers = the final normed state), as transformers' output_hidden_states numbers them."""
        rope = kernels.rope_tables(batch.positions)  # once per step, shared by every layer
        h = self._embed(batch.input_ids)
        residual, tail = None, None
        wanted = batch.hidden_layers
        # a tail left pending for the next norm would make h + residual short of the true state
        norm_tails = wanted is None and self._norms_take_tails(batch, kv_cache, backend, kernels)
        states = {}
        last = len(self.model.layers) - 1
        for i, (layer, kv) in enumerate(zip(self.model.layers, kv_cache)):
            if wanted is not None and i in wanted:
                states[i] = self._state_rows(h, residual, batch.lm_head_indices)
            h, residual, tail = layer(h, residual, rope, batch, kv, backend, kernels, tail, norm_tails, i == last)
        if batch.lm_head_indices is not None:  # norm and project only the rows asked for
            h = h.index_select(0, batch.lm_head_indices)
            residual = residual.index_select(0, batch.lm_head_indices)
        h, _, _ = self.model.norm.add(h, residual, kernels)
        if not self.tp.enabled:
            logits = self.lm_head.project(h, kernels).float()
        else:
            logits = self.tp.all_gather_last(self.lm_head.project(h, kernels))  # [num_out, W * vocab_shard]
            logits = logits[:, : self.cfg.vocab_size].float()
        if wanted is None:
            return logits
        states[len(self.model.layers)] = h
        return logits, torch.stack([states[i].float() for i in wanted], dim=1)

    @staticmethod
    def _state_rows(h: torch.Tensor, residual: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
        """The residual stream h + residual [T, hidden] at rows [num_out] (None: all), as a new
        tensor: the layers update h and residual in place."""
        x = h if residual is None else h + residual
        if rows is not None:
            return x.index_select(0, rows)
        return x.clone() if residual is None else x

    def _norms_take_tails(self, batch: ForwardBatch, kv_cache, backend, kernels) -> bool:
        """Whether this step's residual-add + RMSNorm kernels may take the o / down projections'
        tails (DecoderLayer.forward's norm_tails). Such a norm leaves its division by rms (a row
        scale) to the kernel after the next GEMM, so the kernels must take that scale, and every
        layer's qkv must go through the fused RoPE + store kernel (a function of the step's size,
        the cache and the backend, the same for every layer). A projection hands over a tail only
        where it has one (its wrapper decides)."""
        return (self.model.norm.takes_tail(kernels) and all(l.mlp.takes_row_scale for l in self.model.layers)
                and self.model.layers[0].self_attn.fuses_rope_store(batch.input_ids.shape[0], kv_cache[0], backend,
                                                                     kernels, batch.uses_lora))

    def projections(self) -> dict[tuple[int, str], tuple[nn.Module, str]]:
        """{(layer, name): (parent module, attribute)} of every decoder layer's projection: each
        `<name>_proj` module of the attention and of a dense MLP (qkv, o, gate_up, down). A sparse
        MLP's experts (and its shared expert) are not projections of the layer."""
        out = {}
        for i, layer in enumerate(self.model.layers):
            for path, parent in layer.named_modules():
                if path not in ("self_attn", "mlp"):
                    continue
                for attr, _ in parent.named_children():
                    if attr.endswith("_proj"):
                        out[(i, attr[: -len("_proj")])] = (parent, attr)
        return out

    def wrap_projections(self, wrap) -> None:
        """Replace every decoder layer's projection p with wrap(p, layer, name) (see projections()),
        a module with p's call (layers/linear.py), e.g. one that adds a feature around p."""
        for (i, name), (parent, attr) in self.projections().items():
            setattr(parent, attr, wrap(getattr(parent, attr), i, name))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, hidden]; vocab-parallel: each rank adds the rows of its own id range."""
        if not self.tp.enabled:
            return self.model.embed_tokens(ids)
        local = ids - self.shard.vocab_start
        inside = (local >= 0) & (local < self.shard.vocab_rows)
        h = F.embedding(local.masked_fill(~inside, 0), self.model.embed_tokens.weight)
        return self.tp.all_reduce(h.masked_fill_(~inside[:, None], 0))
