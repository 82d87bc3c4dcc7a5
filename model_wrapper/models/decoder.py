"""The one decoder all families share: embed -> N x (attention, MLP) -> norm -> lm_head.

Weights are fused where that saves launches (q/k/v in qkv_proj, gate/up in gate_up_proj); the
loader fills the fused tensors from the checkpoint's separate ones. A family changes only the
flags in ModelConfig (biases, q/k norm, per-layer sliding windows). The model owns no cache
bookkeeping: the attention backend writes and reads K/V; LoRA, when a batch carries it, adds
its deltas around each projection: `pending = batch.lora.begin(layer, module, x)` before the base
GEMM (on CUDA the LoRA shrink then runs beside it, on a side stream), `batch.lora.finish(pending,
y)` after it; or, where the manager folded its A stacks into the weights (decode graphs), one
`batch.lora.project_folded` call does the GEMM with the shrink in it and the expand. Under
tensor parallelism (a TPGroup of world > 1, see model_wrapper/parallel.py) each rank builds the
layers with its own sizes (TPShard) and the row-parallel projections, the embedding and lm_head
run their collectives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model_wrapper.config import ModelConfig
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.layers.norm import RMSNorm
from model_wrapper.parallel import TPGroup, TPShard


def _project(linear: nn.Linear, x: torch.Tensor, batch: ForwardBatch, layer: int, name: str, kernels,
             defer: bool = False):
    """-> (x @ W^T + b, None) (kernels.linear) with the LoRA delta added, or with defer (the
    caller's next kernel adds it) possibly (y, LoraDelta) where the batch leaves the expand to y's
    consumer."""
    lora = batch.lora
    if lora is not None and lora.folds(layer, name):  # the shrink rides in the GEMM's extra rows
        return lora.project_folded(layer, name, x, defer)
    pending = None if lora is None else lora.begin(layer, name, x)  # before the GEMM: it may overlap it
    y = kernels.linear(x, linear.weight, linear.bias)
    if lora is None:
        return y, None
    if defer:
        return y, lora.finish_deferred(pending, y)
    return lora.finish(pending, y), None


def _project_row_parallel(linear: nn.Linear, x: torch.Tensor, batch: ForwardBatch, layer: int, name: str,
                          kernels, tp: TPGroup, defer: bool = False):
    """Row-parallel projection: partial sums of this rank's input columns (LoRA's partial delta
    included: it is linear in x), all-reduced; the (replicated) bias is added once, after the sum.
    -> (y, None). Without TP: exactly _project (with defer, possibly (y, LoraDelta))."""
    if not tp.enabled:
        return _project(linear, x, batch, layer, name, kernels, defer)
    lora = batch.lora
    pending = None if lora is None else lora.begin(layer, name, x)
    y = kernels.linear(x, linear.weight)
    if lora is not None:
        y = lora.finish(pending, y)
    y = tp.all_reduce(y)
    return (y if linear.bias is None else y + linear.bias), None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.layer, self.tp = layer, tp
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, cfg.head_dim
        self.q_size = shard.num_heads * cfg.head_dim
        self.kv_size = shard.num_kv_heads * cfg.head_dim
        self.window = cfg.layer_windows[layer] if cfg.layer_windows else None
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.family.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.family.qk_norm else None

    def fuses_rope_store(self, T: int, kv, backend, kernels) -> bool:
        """RoPE, the K/V store (and the qkv LoRA expand) in one kernel where the K/V store has that
        path for this step (KVStore.fuses_rope) and no q/k norm sits between the projection and RoPE."""
        return self.q_norm is None and backend.kv_store.fuses_rope(T, kv[0].dtype, self.qkv_proj.weight.dtype)

    def forward(self, x, rope, batch: ForwardBatch, kv, backend, kernels, scale=None, defer_o: bool = False):
        """x [T, hidden] -> ([T, hidden], the o LoraDelta left to the caller or None); writes this
        step's K/V into kv = (k_cache, v_cache). scale: x is add_rms_norm_lora's undivided rows and
        this RowScale divides them (in the fused RoPE + store kernel)."""
        T = x.shape[0]
        fused = self.fuses_rope_store(T, kv, backend, kernels)
        qkv, delta = _project(self.qkv_proj, x, batch, self.layer, "qkv", kernels, defer=fused)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(T, self.num_heads, self.head_dim)
        if scale is not None and (not fused or delta is None):
            raise RuntimeError("a RowScale needs the fused RoPE + store kernel and a deferred qkv delta")
        if fused:
            backend.kv_store.rope_write(kv, qkv, rope, self.num_heads, self.num_kv_heads, self.head_dim, batch.slots,
                                        lora=delta, scale=scale)
            k = k.view(T, self.num_kv_heads, self.head_dim)  # rotated and stored in place
            v = v.view(T, self.num_kv_heads, self.head_dim)
        else:
            k = k.reshape(T, self.num_kv_heads, self.head_dim)
            v = v.reshape(T, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q = kernels.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
                k = kernels.rms_norm(k, self.k_norm.weight, self.k_norm.eps)
            q, k = kernels.rope(q, k, rope)
            backend.kv_store.write(kv, k, v, batch)
        o = backend.run(self.layer, q, kv[0], kv[1], self.window, batch, k=k, v=v)
        return _project_row_parallel(self.o_proj, o.reshape(T, self.q_size), batch, self.layer, "o", kernels, self.tp,
                                     defer_o)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.layer, self.tp = layer, tp
        self.inter = shard.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * self.inter, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(self.inter, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x, batch: ForwardBatch, kernels, scale=None, defer_down: bool = False):
        """-> (down_proj output, the down LoraDelta left to the caller or None); scale as in Attention."""
        if batch.lora is None and scale is None:  # gate_up and SiLU-and-mul, fused where the kernels can
            act = kernels.gate_up_silu(x, self.gate_up_proj.weight, self.gate_up_proj.bias)
            return _project_row_parallel(self.down_proj, act, batch, self.layer, "down", kernels, self.tp, defer_down)
        gate_up, delta = _project(self.gate_up_proj, x, batch, self.layer, "gate_up", kernels,
                                  defer=kernels.fuses_lora)
        if scale is not None and delta is None:
            raise RuntimeError("a RowScale needs a deferred gate_up delta")
        # the gate_up LoRA expand, where deferred, added here (and the norm's division, with scale)
        act = kernels.silu_mul(gate_up, lora=delta, scale=scale)
        return _project_row_parallel(self.down_proj, act, batch, self.layer, "down", kernels, self.tp, defer_down)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: TPShard, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, shard, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layer, shard, tp)

    def forward(self, h, residual, rope, batch, kv, backend, kernels, pending=None, defer: bool = False,
                defer_down: bool = False):
        """Pre-norm residual block in (output, residual) form so that the residual add and the
        next norm fuse into one kernel: h_out + residual_out (+ the returned delta) is the block's
        true output. -> (h_out, residual_out, the down LoraDelta left to the next norm or None).

        pending: the previous block's down delta (h lacks it). defer: the o delta goes into the
        post-attention norm, and `pending` into the input norm, each a column-parallel kernel whose
        division by rms the kernel after the next GEMM does (a RowScale); defer_down: the down delta
        comes back for the next block's input norm."""
        eps = self.input_layernorm.eps
        scale = None
        if residual is None:
            residual, x = h, kernels.rms_norm(h, self.input_layernorm.weight, eps)
        elif pending is not None:
            x, residual, scale = kernels.add_rms_norm_lora(h, residual, self.input_layernorm.weight, eps, pending)
        else:
            x, residual = kernels.add_rms_norm(h, residual, self.input_layernorm.weight, eps)
        h, delta = self.self_attn(x, rope, batch, kv, backend, kernels, scale, defer)
        scale = None
        if delta is not None:
            x, residual, scale = kernels.add_rms_norm_lora(h, residual, self.post_attention_layernorm.weight, eps,
                                                           delta)
        else:
            x, residual = kernels.add_rms_norm(h, residual, self.post_attention_layernorm.weight, eps)
        h, delta = self.mlp(x, batch, kernels, scale, defer and defer_down)
        return h, residual, delta


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
        self.lm_head = nn.Linear(cfg.hidden_size, self.shard.vocab_shard, bias=False)

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch, kv_cache, backend, kernels) -> torch.Tensor:
        """-> float32 logits [num_out, vocab] for batch.lm_head_indices (all tokens if None)."""
        rope = kernels.rope_tables(batch.positions)  # once per step, shared by every layer
        h = self._embed(batch.input_ids)
        residual, pending = None, None
        defer = self._defers_norms(batch, kv_cache, backend, kernels)
        last = len(self.model.layers) - 1
        for i, (layer, kv) in enumerate(zip(self.model.layers, kv_cache)):
            h, residual, pending = layer(h, residual, rope, batch, kv, backend, kernels, pending, defer, i < last)
        if batch.lm_head_indices is not None:  # norm and project only the rows asked for
            h = h.index_select(0, batch.lm_head_indices)
            residual = residual.index_select(0, batch.lm_head_indices)
        h, _ = kernels.add_rms_norm(h, residual, self.model.norm.weight, self.model.norm.eps)
        if not self.tp.enabled:
            return kernels.linear(h, self.lm_head.weight).float()
        logits = self.tp.all_gather_last(kernels.linear(h, self.lm_head.weight))  # [num_out, W * vocab_shard]
        return logits[:, : self.cfg.vocab_size].float()

    def _defers_norms(self, batch: ForwardBatch, kv_cache, backend, kernels) -> bool:
        """Whether this step adds the o / down LoRA deltas inside the residual-add + RMSNorm kernels
        (DecoderLayer.forward's defer): a LoRA graph batch that defers every fused module's expand
        (LoraBatch.defers_norms), kernels that take a RowScale, and the fused RoPE + store path."""
        lora = batch.lora
        return (lora is not None and not self.tp.enabled and kernels.fuses_norm_scale and lora.defers_norms
                and self.model.layers[0].self_attn.fuses_rope_store(batch.input_ids.shape[0], kv_cache[0], backend,
                                                                    kernels))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, hidden]; vocab-parallel: each rank adds the rows of its own id range."""
        if not self.tp.enabled:
            return self.model.embed_tokens(ids)
        local = ids - self.shard.vocab_start
        inside = (local >= 0) & (local < self.shard.vocab_rows)
        h = F.embedding(local.masked_fill(~inside, 0), self.model.embed_tokens.weight)
        return self.tp.all_reduce(h.masked_fill_(~inside[:, None], 0))
