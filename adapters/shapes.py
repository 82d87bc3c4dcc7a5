"""LoraShapes: the sizes of the base model's projections that LoRA may target.

The model fuses projections (q|k|v in "qkv", gate|up in "gate_up"); a PEFT adapter names the
unfused Hugging Face modules. This file is the one table between the two:

    fused module  in_features         output rows (sub-modules, in order)
    "qkv"         hidden_size         [ q_proj: q_size | k_proj: kv_size | v_proj: kv_size ]
    "o"           q_size              [ o_proj: hidden_size ]
    "gate_up"     hidden_size         [ gate_proj: intermediate | up_proj: intermediate ]
    "down"        intermediate_size   [ down_proj: hidden_size ]
"""

from __future__ import annotations

from dataclasses import dataclass

# fused module -> its PEFT (Hugging Face) sub-modules, in the order of the fused output rows
FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
# PEFT module -> (fused module, index of its sub-module)
PEFT_MODULES: dict[str, tuple[str, int]] = {
    peft: (fused, sub) for fused, subs in FUSED_MODULES.items() for sub, peft in enumerate(subs)
}
# PEFT module -> its parent in a decoder layer ("model.layers.N.<parent>.<module>")
PEFT_PARENTS: dict[str, str] = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}


@dataclass(frozen=True)
class LoraShapes:
    """Plain ints of the base model; q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim."""

    num_layers: int
    hidden_size: int
    q_size: int
    kv_size: int
    intermediate_size: int

    def in_features(self, fused: str) -> int:
        return {"qkv": self.hidden_size, "o": self.q_size, "gate_up": self.hidden_size,
                "down": self.intermediate_size}[fused]

    def out_features(self, fused: str) -> tuple[int, ...]:
        """Output rows of each sub-module of `fused`, in order."""
        h, q, kv, i = self.hidden_size, self.q_size, self.kv_size, self.intermediate_size
        return {"qkv": (q, kv, kv), "o": (h,), "gate_up": (i, i), "down": (h,)}[fused]

    def out_offsets(self, fused: str) -> tuple[int, ...]:
        """[n_sub + 1] row offsets of the sub-modules in the fused output: (0, q, q+kv, q+2kv) for qkv."""
        offsets = [0]
        for n in self.out_features(fused):
            offsets.append(offsets[-1] + n)
        return tuple(offsets)

    def peft_shape(self, peft_module: str) -> tuple[int, int]:
        """(in_features, out_features) of one PEFT module: lora_A is [r, in], lora_B is [out, r]."""
        fused, sub = PEFT_MODULES[peft_module]
        return self.in_features(fused), self.out_features(fused)[sub]
