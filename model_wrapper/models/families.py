"""Model families: what each supported architecture changes in the one shared decoder.

A family is a description, not a copy of the decoder: bias on the QKV projection, RMSNorm on
q and k per head, and which layers use a sliding window. Weight names are the Hugging Face ones
for all four families (model.layers.{i}.self_attn.q_proj.weight, ...).
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
class Family:
    name: str
    qkv_bias: bool = False
    qk_norm: bool = False
    layer_windows: Callable[[dict, int], tuple[int | None, ...]] = _no_windows


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama"),
    "MistralForCausalLM": Family("mistral", layer_windows=_mistral_windows),
    "Qwen2ForCausalLM": Family("qwen2", qkv_bias=True, layer_windows=_qwen_windows),
    "Qwen3ForCausalLM": Family("qwen3", qk_norm=True, layer_windows=_qwen_windows),
}
