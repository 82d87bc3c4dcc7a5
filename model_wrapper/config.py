"""ModelConfig: the numbers the shared decoder needs, read from a checkpoint's config.json.

Reads the JSON itself (not transformers' config classes) so that checkpoints saved by
transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`) both load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.models.families import FAMILIES, Family


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters. rope_type: "default", "linear" or "llama3"."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig
    # one entry per layer: None (full attention) or the window W (a token sees the last W keys,
    # itself included, as transformers' sliding_window and FlashInfer's window_left = W - 1)
    layer_windows: tuple[int | None, ...] = field(default=())
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2 always; others by attention_bias)
    o_bias: bool = False  # bias on o_proj (attention_bias in Llama / Mistral / Qwen3)
    mlp_bias: bool = False
    dtype_name: str = "float32"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_pretrained(cls, path: str) -> "ModelConfig":
        if not os.path.isdir(path):
            raise ModelLoadError(
                ModelErrorCode.MISSING_FILE,
                f"checkpoint path: expected a local folder (no hub access), got {path!r}",
            )
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ModelLoadError(
                ModelErrorCode.MISSING_FILE, f"config.json not found in checkpoint folder {path!r}"
            )
        with open(cfg_path) as f:
            raw = json.load(f)
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in FAMILIES:
            raise ModelLoadError(
                ModelErrorCode.UNSUPPORTED_ARCHITECTURE,
                f"config.json architectures: expected one of {sorted(FAMILIES)}, got {archs!r}",
            )
        family = FAMILIES[arch]

        def need(key):
            if key not in raw:
                raise ModelLoadError(
                    ModelErrorCode.BAD_CONFIG, f"config.json: missing required field {key!r}"
                )
            return raw[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if heads % kv_heads != 0:
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG,
                f"config.json: num_attention_heads ({heads}) must be a multiple of "
                f"num_key_value_heads ({kv_heads})",
            )
        act = raw.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(
                ModelErrorCode.UNSUPPORTED_FEATURE, f"config.json hidden_act: expected 'silu', got {act!r}"
            )
        num_layers = int(need("num_hidden_layers"))
        dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        return cls(
            architecture=arch,
            family=family,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope=_rope_from_dict(raw),
            layer_windows=family.layer_windows(raw, num_layers),
            qkv_bias=family.qkv_bias or bool(raw.get("attention_bias", False)),
            o_bias=(not family.qkv_bias) and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            dtype_name=str(dtype_name),
        )


def _rope_from_dict(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise ModelLoadError(
            ModelErrorCode.UNSUPPORTED_FEATURE,
            f"config.json rope type: expected 'default', 'linear' or 'llama3', got {rope_type!r}",
        )
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(
            ModelErrorCode.UNSUPPORTED_FEATURE, "config.json partial_rotary_factor != 1 is not supported"
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
