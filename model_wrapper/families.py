"""Model families: what each supported architecture changes in the one shared decoder.

A family is a description, not a copy of the decoder: bias on the QKV projection, RMSNorm on
q and k per head, which layers use a sliding window, and for mixture-of-experts families how the
config names the experts and how the checkpoint stores them (MoEStyle). Weight names are the
Hugging Face ones (model.layers.{i}.self_attn.q_proj.weight, ...). config.py reads a config.json
through these descriptions; the models (models/) build what the resulting ModelConfig says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _mistral_windows(raw: dict, num_layers: int) -> tuple[int | None, ...]:
    # Mistral applies its sliding_window (when set) to every layer.
    w = raw.get("sliding_window")
    return tuple([int(w) if w else None] * num_layers)


def _qwen_windows(raw: dict, num_layers: int) -> tuple[int | None, ...]:
    # Qwen2/Qwen3 use a window only with use_sliding_window, and only on the layers that
    # layer_types marks "sliding_attention" (older configs: layers >= max_window_layers).
    w = raw.get("sliding_window")
    if not raw.get("use_sliding_window", False) or not w:
        return tuple([None] * num_layers)
    types = raw.get("layer_types")
    if types:
        return tuple(int(w) if t == "sliding_attention" else None for t in types)
    start = int(raw.get("max_window_layers", num_layers))
    return tuple(int(w) if i >= start else None for i in range(num_layers))


def _no_windows(raw: dict, num_layers: int) -> tuple[int | None, ...]:
    return tuple([None] * num_layers)


@dataclass(frozen=True)
class MoEStyle:
    """How a mixture-of-experts family's config.json and checkpoint spell its sparse MLPs.

    experts_keys: config fields that may hold the expert count (the first present is read)
    inter_key:    the config field of each expert's width
    shared:       a shared expert with a sigmoid gate (shared_expert_intermediate_size)
    sparse_step:  decoder_sparse_step and mlp_only_layers choose the sparse layers (else all are)
    always_norm:  the top-k probabilities are always renormalised (else norm_topk_prob says)
    fp32_weights: routing weights stay in fp32 (else rounded to the model dtype)
    module:       the checkpoint's name of the sparse block (model.layers.{i}.<module>.gate.weight)
    projections:  the checkpoint's names of an expert's gate, up and down projections
    """

    experts_keys: tuple[str, ...] = ("num_experts", "num_local_experts")
    inter_key: str = "moe_intermediate_size"
    shared: bool = False
    sparse_step: bool = True
    always_norm: bool = False
    fp32_weights: bool = False
    module: str = "mlp"
    projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")


MIXTRAL_MOE = MoEStyle(experts_keys=("num_local_experts",), inter_key="intermediate_size", sparse_step=False,
                       always_norm=True, fp32_weights=True, module="block_sparse_moe", projections=("w1", "w3", "w2"))


@dataclass(frozen=True)
class Family:
    name: str
    qkv_bias: bool = False
    qk_norm: bool = False
    layer_windows: Callable[[dict, int], tuple[int | None, ...]] = _no_windows
    moe: MoEStyle | None = None  # a mixture-of-experts family


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama"),
    "MistralForCausalLM": Family("mistral", layer_windows=_mistral_windows),
    "Qwen2ForCausalLM": Family("qwen2", qkv_bias=True, layer_windows=_qwen_windows),
    "Qwen3ForCausalLM": Family("qwen3", qk_norm=True, layer_windows=_qwen_windows),
    "Qwen2MoeForCausalLM": Family("qwen2_moe", qkv_bias=True, layer_windows=_qwen_windows, moe=MoEStyle(shared=True)),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", qk_norm=True, layer_windows=_qwen_windows, moe=MoEStyle()),
    "MixtralForCausalLM": Family("mixtral", layer_windows=_mistral_windows, moe=MIXTRAL_MOE),
}
